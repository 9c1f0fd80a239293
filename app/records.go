package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/pmezard/go-difflib/difflib"

	"toolshed.dev/shed/proposal"
	"toolshed.dev/shed/records"
)

func init() {
	op("workshop.add", (*Service).WorkshopAdd)
	op("workshop.allow", (*Service).WorkshopAllow)
	op("workshop.ls", (*Service).WorkshopList)
	op("workshop.show", (*Service).WorkshopShow)
	op("workshop.log", (*Service).WorkshopLog)
	op("workshop.diff", (*Service).WorkshopDiff)
	op("workshop.promote", (*Service).Promote)
	op("proposal.show", (*Service).ProposalShow)
}

// userRE is a user or @group a record may allow: a POSIX-portable name.
var userRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^@?[a-z_][a-z0-9_.-]{0,31}$`) })

// WorkshopAddRequest asks to register a recipe (and its lock) as a new record.
type WorkshopAddRequest struct {
	File  string   `json:"file"`            // the recipe file
	Allow []string `json:"allow,omitempty"` // users (or @groups) who may realize it and launch its Benches
}

// WorkshopAdd records a recipe as version 1 of a new Workshop record, locking it first if needed.
func (s *Service) WorkshopAdd(ctx context.Context, c *Call, req *WorkshopAddRequest) (*records.Version, error) {
	if err := checkAllowed(req.Allow); err != nil {
		return nil, err
	}
	if req.File == "" {
		return nil, usage("shed workshop add FILE", "name the recipe file to record")
	}
	r, err := s.loadRecipe(c, req.File)
	if err != nil {
		return nil, err
	}
	if _, _, isRecord := s.Records().VersionOf(r.File); isRecord {
		return nil, usage("name the recipe file, not a record", "%s is a record already", req.File)
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	if _, _, err := s.lockedPlan(ctx, c, st, r, false); err != nil {
		return nil, err
	}
	files, err := records.ReadFiles(r)
	if err != nil {
		return nil, err
	}
	v, err := s.Records().Add(ctx, records.Version{Name: r.Name, By: c.Caller.User, Users: req.Allow}, files, nil)
	if err != nil {
		return nil, fail(Classify(err).Code, err, "`shed workshop ls` lists the records; a record changes through `shed bench propose` and `shed workshop promote`")
	}
	return v, nil
}

// WorkshopAllowRequest sets who besides operators may use a record.
type WorkshopAllowRequest struct {
	Name  string   `json:"name"`  // the record
	Users []string `json:"users"` // user names and @groups (none: operators only)
}

// WorkshopAllow replaces the list of users (and @groups) allowed to use a record.
func (s *Service) WorkshopAllow(ctx context.Context, c *Call, req *WorkshopAllowRequest) (*records.Version, error) {
	if err := checkAllowed(req.Users); err != nil {
		return nil, err
	}
	return s.Records().Allow(req.Name, req.Users)
}

// checkAllowed refuses a name a record may not allow: not a user or @group name, or no local user or
// group of that name. A record that allows a user who does not exist yet would be used by whoever
// gets that name later, and its allow would be the only sign of the typo (`shed agent key create`
// refuses one too).
func checkAllowed(users []string) error {
	for _, u := range users {
		if !userRE().MatchString(u) {
			return usage("a user name, or @group", "allow %q: not a user or @group name", u)
		}
		if g, ok := strings.CutPrefix(u, "@"); ok {
			if _, err := user.LookupGroup(g); err != nil {
				return usage(fmt.Sprintf("a local group's name (getent group %s); make it first: groupadd %s", g, g), "allow %s: no local group %q", u, g)
			}
			continue
		}
		if _, err := user.Lookup(u); err != nil {
			return usage(fmt.Sprintf("a local user's name (getent passwd %s); make the agent harness's user first: useradd --system %s", u, u), "allow %s: no local user %q", u, u)
		}
	}
	return nil
}

// WorkshopListRequest asks for the records.
type WorkshopListRequest struct{}

// WorkshopListResult is each record's current version.
type WorkshopListResult struct {
	Records []*records.Version `json:"records"` // each record's current version
}

// WorkshopList lists the Workshop records.
func (s *Service) WorkshopList(ctx context.Context, c *Call, req *WorkshopListRequest) (*WorkshopListResult, error) {
	rs := s.Records()
	names, err := rs.Names()
	if err != nil {
		return nil, err
	}
	res := &WorkshopListResult{Records: []*records.Version{}}
	for _, n := range names {
		v, err := rs.Current(n)
		if errors.Is(err, records.ErrNoRecord) {
			// Removed since the directory was read (or still being made): not a record now. CI
			// caught a launch fail while another test removed its template.
			continue
		}
		if err != nil {
			return nil, err
		}
		res.Records = append(res.Records, v)
	}
	return res, nil
}

// WorkshopShowRequest names a record and a version (0: the current one).
type WorkshopShowRequest struct {
	Name    string `json:"name"`              // the record
	Version int    `json:"version,omitempty"` // the version (0: the current one)
}

// WorkshopShowResult is a record version and its recipe.
type WorkshopShowResult struct {
	Version *records.Version `json:"version"` // the version
	Recipe  string           `json:"recipe"`  // the recipe's text
	File    string           `json:"file"`    // the recipe's file in the record
}

// WorkshopShow returns a record version's recipe.
func (s *Service) WorkshopShow(ctx context.Context, c *Call, req *WorkshopShowRequest) (*WorkshopShowResult, error) {
	rs := s.Records()
	var v *records.Version
	var err error
	if req.Version > 0 {
		v, err = rs.Get(req.Name, req.Version)
	} else {
		v, err = rs.Current(req.Name)
	}
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(rs.File(v.Name, v.N))
	if err != nil {
		return nil, err
	}
	return &WorkshopShowResult{Version: v, Recipe: string(b), File: rs.File(v.Name, v.N)}, nil
}

// WorkshopRequest names a record.
type WorkshopRequest struct {
	Name string `json:"name"` // the record
}

// WorkshopLogResult lists a record's versions, oldest first.
type WorkshopLogResult struct {
	Versions []*records.Version `json:"versions"` // every version
}

// WorkshopLog lists a record's versions.
func (s *Service) WorkshopLog(ctx context.Context, c *Call, req *WorkshopRequest) (*WorkshopLogResult, error) {
	vs, err := s.Records().Log(req.Name)
	if err != nil {
		return nil, err
	}
	return &WorkshopLogResult{Versions: vs}, nil
}

// WorkshopDiffRequest names a record and two versions (default: the previous and the current).
type WorkshopDiffRequest struct {
	Name string `json:"name"`        // the record
	A    *int   `json:"a,omitempty"` // the first version (default: the one before the current)
	B    *int   `json:"b,omitempty"` // the second (default: the current)
}

// DiffText is a unified diff, with every character outside printable ASCII shown as «U+XXXX».
type DiffText struct {
	Diff string `json:"diff"` // the unified diff
}

// WorkshopDiff diffs two versions of a record: recipe, lock and key files.
func (s *Service) WorkshopDiff(ctx context.Context, c *Call, req *WorkshopDiffRequest) (*DiffText, error) {
	rs := s.Records()
	cur, err := rs.Current(req.Name)
	if err != nil {
		return nil, err
	}
	a, b := cur.N-1, cur.N
	if req.A != nil {
		a = *req.A
	}
	if req.B != nil {
		b = *req.B
	}
	for _, n := range []int{a, b} {
		if n < 0 || n > cur.N {
			return nil, usage("`shed workshop log NAME` lists the versions", "%s has no version %d", cur.Name, n)
		}
	}
	files := func(n int) map[string]string {
		out := map[string]string{}
		if n < 1 {
			return out
		}
		dir := rs.Dir(cur.Name, n)
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() == "version.json" {
				return nil
			}
			if b, err := os.ReadFile(p); err == nil {
				rel, _ := filepath.Rel(dir, p)
				out[rel] = string(b)
			}
			return nil
		})
		return out
	}
	fa, fb := files(a), files(b)
	names := []string{"workshop.toml", "workshop.lock"}
	for _, m := range []map[string]string{fa, fb} {
		for n := range m {
			if n != "workshop.toml" && n != "workshop.lock" && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	var out strings.Builder
	for _, f := range names {
		ud, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{A: difflib.SplitLines(fa[f]), B: difflib.SplitLines(fb[f]),
			FromFile: fmt.Sprintf("a/%s (version %d)", f, a), ToFile: fmt.Sprintf("b/%s (version %d)", f, b), Context: 3})
		out.WriteString(ud)
	}
	return &DiffText{Diff: proposal.Visible(out.String())}, nil
}

// ProposalRequest names a proposal.
type ProposalRequest struct {
	ID string `json:"id"` // the proposal's id (16 hex digits)
	// ForPromotion refuses a proposal that could not be promoted now (promoted before, or made against
	// a version that is no longer current), before anyone reads its diff.
	ForPromotion bool `json:"for_promotion,omitempty"`
}

// ProposalShow returns a proposal and the diff a human confirms to promote it.
func (s *Service) ProposalShow(ctx context.Context, c *Call, req *ProposalRequest) (*ProposeResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	sv := proposal.New(st, nil)
	if req.ForPromotion {
		if err := sv.Promotable(req.ID); err != nil {
			return nil, s.noProposal(c, st, req.ID, err)
		}
	}
	p, diff, err := sv.Get(req.ID)
	if err != nil {
		return nil, s.noProposal(c, st, req.ID, err)
	}
	return &ProposeResult{Proposal: p, Diff: diff}, nil
}

// PromoteRequest confirms a proposal: DiffSHA256 is the SHA-256 of the diff the human was shown.
type PromoteRequest struct {
	ID         string `json:"id"`                   // the proposal
	DiffSHA256 string `json:"diff_sha256"`          // the SHA-256 (hex) of the diff the human was shown
	NoRealize  bool   `json:"no_realize,omitempty"` // do not realize the new version
}

// PromoteResult is the record version made, and its layers when it was realized.
type PromoteResult struct {
	Version *records.Version `json:"version"`          // the record version made
	Layers  []string         `json:"layers,omitempty"` // the new version's layers, when realized
}

// Promote makes a proposal the next version of its record, if the diff confirmed is still exactly
// what the proposal gives against the version it was made for, once; then realizes it.
func (s *Service) Promote(ctx context.Context, c *Call, req *PromoteRequest) (*PromoteResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	ps := proposal.New(st, s.newBuilder(c, st, false))
	v, err := ps.Promote(ctx, req.ID, req.DiffSHA256, c.Caller.User)
	if err != nil {
		return nil, s.noProposal(c, st, req.ID, err)
	}
	res := &PromoteResult{Version: v}
	if req.NoRealize {
		return res, nil
	}
	w := &realized{st: st}
	if w.r, err = s.loadRecipe(c, ps.Records.File(v.Name, v.N)); err != nil {
		return res, err
	}
	if err := s.realizeIn(ctx, c, w, false, nil); err != nil {
		return res, err
	}
	res.Layers = locations(st, w.res.Layers)
	return res, nil
}
