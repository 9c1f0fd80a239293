package proposal

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/pmezard/go-difflib/difflib"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/internal/atomicfile"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/records"
	"toolshed.dev/shed/store"
)

// A proposal is a new version of a Workshop's recipe and lock, derived from what a Bench did, with the
// plain diff a human reads before confirming it:
//
//	<root>/proposals/<id>/workshop.toml, workshop.lock, proposal.json, diff (and the recipe's key files)
//	<root>/proposals/<id>/used          created when it is promoted: a confirmation is single-use
type Proposal struct {
	ID       string `json:"id"`
	Workshop string `json:"workshop"`
	Base     int    `json:"base"` // the record version it applies to (0: a new record)
	Bench    string `json:"bench"`
	// From is what made it when no Bench did: "e2b template build ID" (ProposeRecipe), and Proposer
	// who: a new record promoted from it allows them.
	From     string    `json:"from,omitempty"`
	Proposer string    `json:"proposer,omitempty"`
	Created  time.Time `json:"created"`
	// Widens lists what the proposal opens that the base did not: network destinations, grants.
	Widens []string `json:"widens,omitempty"`
	// Added lists the packages it adds, as pinned.
	Added []string `json:"added,omitempty"`
	// Grants are the grants the Bench used (within the recipe's bounds; shown, not changed).
	Grants     []string `json:"grants,omitempty"`
	DiffSHA256 string   `json:"diff_sha256"`
}

// Errors of proposals.
var (
	ErrNoProposal = errors.New("no such proposal")
	ErrUsed       = errors.New("the proposal was already promoted: a confirmation is single-use")
	ErrChanged    = errors.New("the proposal is not what was shown")
	ErrNothing    = errors.New("the Bench installed nothing the recipe lacks")
)

// Proposals are the proposals of a store, made from Benches and promoted into its records.
type Proposals struct {
	Store   *store.Store
	Records *records.Workshops
	Builder *builder.Builder // locks proposals (network to the mirror and the index)
}

// New returns the proposals of s.
func New(s *store.Store, b *builder.Builder) *Proposals {
	return &Proposals{Store: s, Records: records.Open(s.Root()), Builder: b}
}

func (sv *Proposals) proposalDir(id string) string {
	return filepath.Join(sv.Store.Root(), "proposals", id)
}

// ErrUnfinished refuses a proposal from a Bench whose dpkg state has packages half installed or half
// configured.
var ErrUnfinished = errors.New("unfinished package operations")

// Propose derives a proposal from the Bench named nameOrID: its recipe, plus the packages it installed
// (pinned to the versions installed), plus the destinations its proxy refused; locked; diffed against
// the current record of its Workshop. Nothing of the Bench's files but dpkg's, apt's and pip's own
// records is read, and nothing of them is kept.
func (sv *Proposals) Propose(ctx context.Context, nameOrID string) (*Proposal, string, error) {
	rec, err := bench.Find(sv.Store, nameOrID)
	if err != nil {
		return nil, "", err
	}
	launched, err := recipe.Load(rec.Workshop, recipe.Options{ForbiddenPaths: []string{sv.Store.Root()}})
	if err != nil {
		return nil, "", fmt.Errorf("the Bench's recipe: %w", err)
	}
	// The base is the record's current version, or the Bench's recipe for a Workshop not recorded yet.
	baseFile, baseN := rec.Workshop, 0
	if cur, err := sv.Records.Current(launched.Name); err == nil {
		baseFile, baseN = sv.Records.File(cur.Name, cur.N), cur.N
	} else if !errors.Is(err, records.ErrNoRecord) {
		return nil, "", err
	}
	base, err := recipe.Load(baseFile, recipe.Options{ForbiddenPaths: []string{sv.Store.Root()}})
	if err != nil {
		return nil, "", err
	}
	files, err := records.ReadFiles(base)
	if err != nil {
		return nil, "", err
	}
	obs, err := Observe(sv.Store, rec)
	if err != nil {
		return nil, "", err
	}
	if len(obs.Unfinished) > 0 {
		// A recipe names packages; it cannot say "half configured". Promoting would record what the
		// Bench never got working.
		return nil, "", fmt.Errorf("%w: bench %s: dpkg left %s", ErrUnfinished, rec.Name, strings.Join(obs.Unfinished, ", "))
	}
	p := &Proposal{ID: randomID(), Workshop: base.Name, Base: baseN, Bench: rec.Name, Created: time.Now().UTC().Truncate(time.Second)}
	for _, g := range obs.Grants {
		p.Grants = append(p.Grants, fmt.Sprintf("%s:%s:%s", g.Host, g.Bench, g.Mode))
	}
	text := files.Recipe
	var update []string

	apt := make([]string, 0, len(base.Apt.Packages))
	for _, a := range base.Apt.Packages {
		apt = append(apt, a.String())
	}
	for _, pkg := range obs.Apt {
		if slices.ContainsFunc(base.Apt.Packages, func(a recipe.AptPackage) bool { return a.Name == pkg.Package }) {
			continue
		}
		pin := pkg.Package + "=" + pkg.Version
		if _, err := recipe.ParseAptPackage(pin); err != nil {
			return nil, "", fmt.Errorf("the Bench installed %q, which a recipe cannot name: %v", pin, err)
		}
		apt, update, p.Added = append(apt, pin), append(update, pkg.Package), append(p.Added, "apt "+pin)
	}
	if len(apt) > len(base.Apt.Packages) {
		if text, err = recipe.SetArray(text, "apt", "packages", apt); err != nil {
			return nil, "", err
		}
	}
	pip := make([]string, 0, len(base.Pip.Packages))
	for _, q := range base.Pip.Packages {
		pip = append(pip, q.String())
	}
	for _, d := range obs.Pip {
		if slices.ContainsFunc(base.Pip.Packages, func(q recipe.PipPackage) bool { return recipe.NormalizePipName(q.Name) == d.Name }) {
			continue
		}
		pin := d.Name + "==" + d.Version
		if _, err := recipe.ParsePipPackage(pin); err != nil {
			return nil, "", fmt.Errorf("the Bench installed %q, which a recipe cannot name: %v", pin, err)
		}
		pip, update, p.Added = append(pip, pin), append(update, d.Name), append(p.Added, "pip "+pin)
	}
	if len(pip) > len(base.Pip.Packages) {
		if text, err = recipe.SetArray(text, "pip", "packages", pip); err != nil {
			return nil, "", err
		}
	}
	allow := make([]string, 0, len(base.Network.Allow))
	for _, h := range base.Network.Allow {
		allow = append(allow, h.String())
	}
	for _, dest := range obs.Refused {
		if slices.Contains(allow, dest) {
			continue
		}
		if _, err := recipe.ParseHost(dest); err != nil {
			continue // an address no recipe may allow (private, loopback, a literal): not proposed
		}
		allow, p.Widens = append(allow, dest), append(p.Widens, "network: "+dest)
	}
	if len(allow) > len(base.Network.Allow) {
		if text, err = recipe.SetArray(text, "network", "allow", allow); err != nil {
			return nil, "", err
		}
	}
	if len(p.Added) == 0 && len(p.Widens) == 0 {
		return nil, "", fmt.Errorf("%w (bench %s)", ErrNothing, rec.Name)
	}
	diff, err := sv.write(ctx, p, files, text, baseFile, update)
	if err != nil {
		return nil, "", err
	}
	return p, diff, nil
}

// ProposeRecipe proposes text as the next version of the record name (or its first), on behalf of
// from (what made it: "e2b template build ID"): locked, diffed against the current version, written
// as a proposal an operator promotes. extra are the files the recipe refers to (keys).
//
// A new record starts from baseLock, if given (the lock of the record the recipe was made from): what
// it pins stays pinned, and a recipe that adds nothing to it is locked without the mirror.
func (sv *Proposals) ProposeRecipe(ctx context.Context, name string, text []byte, extra map[string][]byte, baseLock []byte, from, proposer string) (*Proposal, string, error) {
	p := &Proposal{ID: randomID(), Workshop: name, From: from, Proposer: proposer, Created: time.Now().UTC().Truncate(time.Second)}
	files, baseFile := &records.Files{Extra: extra, Lock: baseLock}, ""
	var base *recipe.Recipe
	if cur, err := sv.Records.Current(name); err == nil {
		baseFile, p.Base = sv.Records.File(cur.Name, cur.N), cur.N
		if base, err = recipe.Load(baseFile, recipe.Options{ForbiddenPaths: []string{sv.Store.Root()}}); err != nil {
			return nil, "", err
		}
		if files, err = records.ReadFiles(base); err != nil {
			return nil, "", err
		}
	} else if !errors.Is(err, records.ErrNoRecord) {
		return nil, "", err
	}
	next, err := recipe.Parse("workshop.toml", text, recipe.Options{ForbiddenPaths: []string{sv.Store.Root()}})
	if err != nil {
		return nil, "", err
	}
	if next.Name != name {
		return nil, "", fmt.Errorf("the proposed recipe is named %q, not %q", next.Name, name)
	}
	var update []string
	for _, a := range next.Apt.Packages {
		if base == nil || !slicesHasApt(base.Apt.Packages, a.Name) {
			p.Added, update = append(p.Added, "apt "+a.String()), append(update, a.Name)
		}
	}
	for _, q := range next.Pip.Packages {
		if base == nil || !slices.ContainsFunc(base.Pip.Packages, func(b recipe.PipPackage) bool {
			return recipe.NormalizePipName(b.Name) == recipe.NormalizePipName(q.Name)
		}) {
			p.Added, update = append(p.Added, "pip "+q.String()), append(update, q.Name)
		}
	}
	for _, h := range next.Network.Allow {
		if base == nil || !slices.ContainsFunc(base.Network.Allow, func(b recipe.Host) bool { return b.String() == h.String() }) {
			p.Widens = append(p.Widens, "network: "+h.String())
		}
	}
	for _, n := range next.Network.Secrets {
		if base == nil || !slices.Contains(base.Network.Secrets, n) {
			p.Widens = append(p.Widens, "secret: "+n) // a name: the value stays in the supervisor
		}
	}
	if (base == nil && next.Network.Profile != "none") || (base != nil && next.Network.Profile != base.Network.Profile) {
		p.Widens = append(p.Widens, "network profile: "+next.Network.Profile)
	}
	// What else the whole recipe a proposer wrote may open: host paths, root through sudo.
	for _, g := range next.Grants {
		if base == nil || !slices.Contains(base.Grants, g) {
			p.Widens = append(p.Widens, fmt.Sprintf("grant: %s (%s)", g.Path, g.Mode))
		}
	}
	for _, a := range next.Accounts {
		if a.Sudo && (base == nil || !slices.ContainsFunc(base.Accounts, func(b recipe.Account) bool { return b.Name == a.Name && b.Sudo })) {
			p.Widens = append(p.Widens, "sudo: account "+a.Name+" may run anything as root")
		}
	}
	if base != nil && next.Seed.Raw != base.Seed.Raw {
		p.Widens = append(p.Widens, "seed: "+next.Seed.Raw)
	}
	diff, err := sv.write(ctx, p, &records.Files{Recipe: files.Recipe, Lock: files.Lock, Extra: extra}, text, baseFile, update)
	if err != nil {
		return nil, "", err
	}
	return p, diff, nil
}

// compareLock is Lock.Compare, false for no lock.
func compareLock(l *recipe.Lock, r *recipe.Recipe) (inputs, accounts bool, err error) {
	if l == nil {
		return false, false, nil
	}
	return l.Compare(r)
}

func slicesHasApt(ps []recipe.AptPackage, name string) bool {
	return slices.ContainsFunc(ps, func(a recipe.AptPackage) bool { return a.Name == name })
}

// write writes proposal p: text as its recipe (files: the base version's, whose lock it starts
// from and whose diff it shows; baseFile "" for a new record), locked with update re-resolved.
func (sv *Proposals) write(ctx context.Context, p *Proposal, files *records.Files, text []byte, baseFile string, update []string) (string, error) {
	baseN := p.Base
	// Write it, lock it (the new packages at the versions the Bench installed, the others kept). Every
	// file is durable before proposal.json, which makes the proposal exist (Get).
	dir := sv.proposalDir(p.ID)
	if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	for rel, b := range files.Extra {
		if !filepath.IsLocal(rel) || slices.Contains(ownFiles, strings.Split(rel, "/")[0]) {
			return "", fmt.Errorf("the recipe's file %q: not a plain relative path, or one of the proposal's own", rel)
		}
		if err := atomicfile.MkdirAll(filepath.Dir(filepath.Join(dir, rel)), 0o700); err != nil {
			return "", err
		}
		if err := atomicfile.WriteFile(filepath.Join(dir, rel), b, 0o644); err != nil {
			return "", err
		}
	}
	file := filepath.Join(dir, "workshop.toml")
	if err := atomicfile.WriteFile(file, text, 0o644); err != nil {
		return "", err
	}
	next, err := recipe.Load(file, recipe.Options{ForbiddenPaths: []string{sv.Store.Root()}})
	if err != nil {
		return "", fmt.Errorf("the proposed recipe: %w", err)
	}
	var old *recipe.Lock
	switch {
	case baseFile != "":
		if old, err = recipe.LoadLock(recipe.LockFile(baseFile)); err != nil {
			return "", err
		}
	case len(files.Lock) > 0:
		if old, err = recipe.ParseLock("the base's workshop.lock", files.Lock); err != nil {
			return "", err
		}
	}
	lock := old
	if inputs, accounts, err := compareLock(old, next); err != nil {
		return "", err
	} else if !inputs || !accounts {
		if lock, err = sv.Builder.Lock(ctx, next, builder.LockOptions{Old: old, Update: update}); err != nil {
			return "", fmt.Errorf("lock the proposal: %w", err)
		}
	}
	lockBytes, err := lock.Encode()
	if err != nil {
		return "", err
	}
	if err := atomicfile.WriteFile(recipe.LockFile(file), lockBytes, 0o644); err != nil {
		return "", err
	}
	// A new record is diffed against nothing: the Bench's recipe it started from was never reviewed,
	// so every line of what will be recorded is shown.
	shownBase := files
	if baseN == 0 {
		shownBase = &records.Files{}
	}
	diff := sv.diff(p, shownBase, &records.Files{Recipe: text, Lock: lockBytes, Extra: files.Extra})
	p.DiffSHA256 = sha(diff)
	if err := atomicfile.WriteFile(filepath.Join(dir, "diff"), []byte(diff), 0o644); err != nil {
		return "", err
	}
	meta, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return "", err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, "proposal.json"), append(meta, '\n'), 0o644); err != nil {
		return "", err
	}
	ok = true
	return diff, nil
}

// ownFiles are the names of a proposal's directory that are not the recipe's files: an extra file
// (a key of [[apt.source]]) may not be one of them.
var ownFiles = []string{"workshop.toml", "workshop.lock", "diff", "proposal.json", "used"}

// diff is what the human reads: a header (what the proposal adds, what it widens), then the unified
// diffs of the recipe, the lock and each file the recipe refers to (the keys of [[apt.source]]),
// between old (the version it was made for; empty for a new record) and new. A binary file is shown
// as its size and SHA-256, on a line of its own that no line of a text diff can look like. Promote
// computes it again from the files on disk.
func (sv *Proposals) diff(p *Proposal, old, new *records.Files) string {
	var b strings.Builder
	if p.From != "" {
		fmt.Fprintf(&b, "proposal %s for Workshop %s, version %d, from %s\n", p.ID, p.Workshop, p.Base, p.From)
	} else {
		fmt.Fprintf(&b, "proposal %s for Workshop %s, version %d, from Bench %s\n", p.ID, p.Workshop, p.Base, p.Bench)
	}
	if p.Base == 0 && p.Proposer != "" {
		fmt.Fprintf(&b, "allows: %s (a new record: its proposer may launch it)\n", p.Proposer)
	}
	if len(p.Widens) > 0 {
		fmt.Fprintf(&b, "WIDENS ACCESS: %s\n", strings.Join(p.Widens, "; "))
	}
	for _, a := range p.Added {
		fmt.Fprintf(&b, "adds: %s\n", a)
	}
	for _, g := range p.Grants {
		fmt.Fprintf(&b, "grant used: %s\n", g)
	}
	unified := func(name string, a, z []byte, inA, inZ bool) {
		var al, zl []string
		if inA {
			al = difflib.SplitLines(string(a))
		}
		if inZ {
			zl = difflib.SplitLines(string(z))
		}
		ud, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
			A: al, B: zl,
			FromFile: fmt.Sprintf("a/%s (version %d)", name, p.Base), ToFile: "b/" + name + " (proposed)", Context: 3,
		})
		b.WriteString(ud)
	}
	unified("workshop.toml", old.Recipe, new.Recipe, p.Base > 0, true)
	unified("workshop.lock", old.Lock, new.Lock, p.Base > 0, true)
	for _, rel := range slices.Sorted(maps.Keys(mergeKeys(old.Extra, new.Extra))) {
		a, inA := old.Extra[rel]
		z, inZ := new.Extra[rel]
		name := fileName(rel)
		switch {
		case inA && inZ && bytes.Equal(a, z):
			continue
		case isBinary(a) || isBinary(z):
			fmt.Fprintf(&b, "binary file %s: version %d %s, proposed %s\n", name, p.Base, describe(a, inA), describe(z, inZ))
		default:
			switch {
			case !inA:
				fmt.Fprintf(&b, "new file %s\n", name)
			case !inZ:
				fmt.Fprintf(&b, "removed file %s\n", name)
			}
			unified(name, a, z, inA, inZ)
		}
	}
	return b.String()
}

func mergeKeys(a, b map[string][]byte) map[string]bool {
	m := map[string]bool{}
	for k := range a {
		m[k] = true
	}
	for k := range b {
		m[k] = true
	}
	return m
}

// isBinary: what a terminal cannot show as lines (Visible shows the rest of what it would hide).
func isBinary(b []byte) bool { return !utf8.Valid(b) || bytes.IndexByte(b, 0) >= 0 }

func describe(b []byte, present bool) string {
	if !present {
		return "absent"
	}
	h := sha256.Sum256(b)
	return fmt.Sprintf("%d bytes, sha256 %s", len(b), hex.EncodeToString(h[:]))
}

// fileName is a relative file name as the diff shows it: quoted unless it is plain.
func fileName(rel string) string {
	if rel != "" && strings.Trim(rel, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-/") == "" {
		return rel
	}
	return strconv.Quote(rel)
}

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// Get returns a proposal and its diff.
func (sv *Proposals) Get(id string) (*Proposal, string, error) {
	if len(id) != 16 || strings.Trim(id, "0123456789abcdef") != "" {
		return nil, "", fmt.Errorf("%w: %q", ErrNoProposal, id)
	}
	dir := sv.proposalDir(id)
	b, err := os.ReadFile(filepath.Join(dir, "proposal.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", fmt.Errorf("%w: %s", ErrNoProposal, id)
	} else if err != nil {
		return nil, "", err
	}
	var p Proposal
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, "", err
	}
	diff, err := os.ReadFile(filepath.Join(dir, "diff"))
	if err != nil {
		return nil, "", err
	}
	return &p, string(diff), nil
}

// Promote makes proposal id the next version of its Workshop. confirmed is the SHA-256 of the diff the
// human saw and confirmed: the proposal's files (its recipe, lock and the recipe's key files) must
// still give exactly that diff against the record version it was made for (against nothing for a new
// record), that version must still be current (for a new record: no record of that name may exist),
// and the proposal must not have been promoted before. Racing promotions of one base: exactly one wins.
func (sv *Proposals) Promote(ctx context.Context, id, confirmed, by string) (*records.Version, error) {
	p, diff, err := sv.Get(id)
	if err != nil {
		return nil, err
	}
	if confirmed != p.DiffSHA256 || sha(diff) != confirmed {
		return nil, fmt.Errorf("%w: the confirmed diff is not the proposal's", ErrChanged)
	}
	dir := sv.proposalDir(id)
	base := p.Base
	old := &records.Files{}
	var users []string
	if base == 0 && p.Proposer != "" {
		users = []string{p.Proposer} // shown in the diff confirmed: "allows: USER"
	}
	if base > 0 {
		bv, err := sv.Records.Get(p.Workshop, base)
		if err != nil {
			return nil, err
		}
		users = bv.Users
		br, err := recipe.Load(sv.Records.File(p.Workshop, base), recipe.Options{ForbiddenPaths: []string{sv.Store.Root()}})
		if err != nil {
			return nil, err
		}
		if old, err = records.ReadFiles(br); err != nil {
			return nil, err
		}
	}
	r, err := recipe.Load(filepath.Join(dir, "workshop.toml"), recipe.Options{ForbiddenPaths: []string{sv.Store.Root()}})
	if err != nil {
		return nil, err
	}
	files, err := records.ReadFiles(r)
	if err != nil {
		return nil, err
	}
	// What is recorded is what was shown: the diff again, from the files that will be recorded.
	if again := sv.diff(p, old, files); sha(again) != confirmed {
		return nil, fmt.Errorf("%w: its files were changed after it was made", ErrChanged)
	}
	used := filepath.Join(dir, "used")
	return sv.Records.Add(ctx, records.Version{Name: p.Workshop, Base: base, By: by, Proposal: id, Users: users}, files, func() error {
		f, err := os.OpenFile(used, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
			return ErrUsed
		} else if err != nil {
			return err
		}
		// Durable before the version is written: a crash cannot leave the confirmation reusable.
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("mark proposal %s used: %w", id, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("mark proposal %s used: %w", id, err)
		}
		return atomicfile.SyncDir(dir)
	})
}

// Promotable says whether proposal id could be promoted now: not promoted before (ErrUsed), and made
// against the record's current version (records.ErrConflict otherwise; for a new record: no record of
// that name exists). Promote checks both again, atomically; this is for refusing before a human reads
// a diff that could not be confirmed.
func (sv *Proposals) Promotable(id string) error {
	p, _, err := sv.Get(id)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(sv.proposalDir(id), "used")); err == nil {
		return fmt.Errorf("proposal %s: %w", id, ErrUsed)
	}
	cur, err := sv.Records.Current(p.Workshop)
	switch {
	case errors.Is(err, records.ErrNoRecord) && p.Base == 0:
		return nil
	case errors.Is(err, records.ErrNoRecord):
		return fmt.Errorf("proposal %s: %w: the record %s it was made against is gone", id, records.ErrConflict, p.Workshop)
	case err != nil:
		return err
	case cur.N != p.Base:
		return fmt.Errorf("proposal %s: %w: it was made against version %d of %s, which is now at version %d", id, records.ErrConflict, p.Base, p.Workshop, cur.N)
	}
	return nil
}

// Visible shows what a terminal would hide: every character outside printable ASCII (but newline and
// tab) as «U+XXXX», so that a look-alike letter or an invisible one cannot pass for what it is not.
func Visible(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r > unicode.MaxASCII || !unicode.IsPrint(r):
			fmt.Fprintf(&b, "«U+%04X»", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
