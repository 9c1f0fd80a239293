package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"toolshed.dev/shed/internal/atomicfile"
	"toolshed.dev/shed/proposal"
	"toolshed.dev/shed/recipe"
	"toolshed.dev/shed/records"
)

// A template build (E2B's Template.build, package e2b) ends here as a recipe: an operator's becomes
// the record's next version at once (an operator's act, audited like workshop.add), anyone else's a
// proposal an operator promotes, as an agent's change to a Workshop does. The recipe is the truth
// either way; what the template's steps were is not kept.

func init() {
	op("workshop.submit", (*Service).WorkshopSubmit)
	op("workshop.rm", (*Service).WorkshopRemove)
	op("workshop.tag", (*Service).WorkshopTag)
	op("workshop.tags", (*Service).WorkshopTags)
}

// WorkshopSubmitRequest is a recipe for the record Name: its next version (its first, for a new
// name).
type WorkshopSubmitRequest struct {
	Name   string `json:"name"`   // the record; the recipe's name must be it
	Recipe string `json:"recipe"` // the recipe's text (workshop.toml)
	// Base is the record the recipe was made from, if any: the files its recipe refers to (the keys
	// of [[apt.source]]) are the new version's too.
	Base string   `json:"base,omitempty"`
	Tags []string `json:"tags,omitempty"` // tags for the new version (an operator's only)
	From string   `json:"from,omitempty"` // what made it, for the proposal ("e2b template build ID")
}

// WorkshopSubmitResult is the version recorded (an operator's submit, realized), or the proposal
// made (anyone else's) and its diff.
type WorkshopSubmitResult struct {
	Version  *records.Version   `json:"version,omitempty"`
	Layers   []string           `json:"layers,omitempty"`
	Proposal *proposal.Proposal `json:"proposal,omitempty"`
	Diff     string             `json:"diff,omitempty"`
}

// WorkshopSubmit records a recipe as the next version of its record when an operator submits it:
// locked, realized (so that what is recorded builds), then recorded over the current version, whose
// allowed users it keeps. Anyone else's becomes a proposal, locked and diffed, that an operator
// reviews and promotes (`shed workshop promote ID` shows its diff and asks).
func (s *Service) WorkshopSubmit(ctx context.Context, c *Call, req *WorkshopSubmitRequest) (*WorkshopSubmitResult, error) {
	if !records.IsName(req.Name) {
		return nil, usage("a record name: lowercase letters, digits, '.', '_' and '-'", "name %q", req.Name)
	}
	for _, t := range req.Tags {
		if !records.IsTag(t) {
			return nil, usage("a tag: lowercase letters, digits, '.', '_' and '-'", "tag %q", t)
		}
	}
	var extra map[string][]byte
	var baseLock []byte
	if req.Base != "" {
		cur, err := s.Records().Current(req.Base)
		if err != nil {
			return nil, err
		}
		br, err := recipe.Load(s.Records().File(cur.Name, cur.N), recipe.Options{ForbiddenPaths: []string{s.Root}})
		if err != nil {
			return nil, err
		}
		files, err := records.ReadFiles(br)
		if err != nil {
			return nil, err
		}
		extra, baseLock = files.Extra, files.Lock
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	if c.Caller.Role != Operator {
		if err := s.checkProposedRecipe(req); err != nil {
			return nil, err
		}
		if len(req.Tags) > 0 {
			return nil, fail(CodeDenied, fmt.Errorf("%w: tags name recorded versions, and only an operator records one", ErrDenied),
				"build without tags; an operator tags the version once the proposal is promoted")
		}
		sv := proposal.New(st, s.newBuilder(c, st, false))
		p, diff, err := sv.ProposeRecipe(ctx, req.Name, []byte(req.Recipe), extra, baseLock, req.From, c.Caller.User)
		if err != nil {
			return nil, err
		}
		c.wrote.Store(true)
		return &WorkshopSubmitResult{Proposal: p, Diff: diff}, nil
	}
	dir, release, err := st.Stage(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	file := filepath.Join(dir, "workshop.toml")
	for rel, b := range extra {
		if !filepath.IsLocal(rel) || rel == "workshop.toml" || rel == "workshop.lock" {
			return nil, usage("the recipe's key files, by plain relative paths", "file %q", rel)
		}
		if err := atomicfile.MkdirAll(filepath.Dir(filepath.Join(dir, rel)), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, rel), b, 0o644); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(file, []byte(req.Recipe), 0o644); err != nil {
		return nil, err
	}
	if len(baseLock) > 0 {
		// The base's pins, kept: locking resolves only what the recipe adds (nothing: no mirror).
		if err := os.WriteFile(recipe.LockFile(file), baseLock, 0o644); err != nil {
			return nil, err
		}
	}
	r, err := s.plans.recipe(file, []byte(req.Recipe), recipe.Options{ForbiddenPaths: []string{s.Root}})
	if err != nil {
		return nil, err
	}
	if r.Name != req.Name {
		return nil, usage("name the recipe as its record", "the recipe is named %q, not %q", r.Name, req.Name)
	}
	w := &realized{r: r, st: st}
	if err := s.realizeIn(ctx, c, w, false, nil); err != nil {
		return nil, err
	}
	files, err := records.ReadFiles(r)
	if err != nil {
		return nil, err
	}
	v := records.Version{Name: r.Name, By: c.Caller.User}
	if cur, err := s.Records().Current(r.Name); err == nil {
		v.Base, v.Users = cur.N, cur.Users
	} else if !errors.Is(err, records.ErrNoRecord) {
		return nil, err
	}
	rec, err := s.Records().Add(ctx, v, files, nil)
	if err != nil {
		return nil, err
	}
	c.wrote.Store(true)
	res := &WorkshopSubmitResult{Version: rec}
	// The version's own root (workshop-NAME-vN), as a promotion's realize makes it: a cache hit.
	vw := &realized{st: st}
	if vw.r, err = s.loadRecipe(c, s.Records().File(rec.Name, rec.N)); err != nil {
		return res, err
	}
	if err := s.realizeIn(ctx, c, vw, true, nil); err != nil {
		return res, err
	}
	res.Layers = locations(st, vw.res.Layers)
	if len(req.Tags) > 0 {
		if _, err := s.Records().SetTags(rec.Name, rec.N, req.Tags, nil); err != nil {
			return res, err
		}
	}
	return res, nil
}

// checkProposedRecipe refuses what a non-operator's recipe may not make the supervisor do before a
// human has read it: locking it reads its seed and asks its mirror, index and registry, as root. So
// its seed is Debian's or an image in a registry that is not this machine's or its network's (an
// image directory is a host path), and its mirror, sources, index and grants are its base record's
// (the defaults for a new one): what the translation of a template's steps leaves them.
func (s *Service) checkProposedRecipe(req *WorkshopSubmitRequest) error {
	r, err := recipe.Parse("workshop.toml", []byte(req.Recipe), recipe.Options{ForbiddenPaths: []string{s.Root}})
	if err != nil {
		return err
	}
	base := &recipe.Recipe{Apt: recipe.Apt{Mirror: recipe.DefaultMirror}, Pip: recipe.Pip{Index: recipe.DefaultIndex}}
	if req.Base != "" {
		cur, err := s.Records().Current(req.Base)
		if err != nil {
			return err
		}
		if base, err = recipe.Load(s.Records().File(cur.Name, cur.N), recipe.Options{ForbiddenPaths: []string{s.Root}}); err != nil {
			return err
		}
	}
	refuse := func(what string) error {
		return fail(CodeDenied, fmt.Errorf("%w: %s, in a recipe an operator has not read", ErrDenied, what),
			"build from a Workshop record (fromTemplate), Debian's images, or an image of a public registry; an operator's key may build the rest, or record it (`shed workshop add`)")
	}
	switch {
	case r.Seed.Kind == "oci" && !r.Seed.IsRegistry() && r.Seed.Raw != base.Seed.Raw:
		return refuse("a seed from an image directory (" + r.Seed.Raw + ") is a path of the host")
	case r.Seed.IsRegistry() && r.Seed.Raw != base.Seed.Raw && privateHost(r.Seed.Ref):
		return refuse("an image of a registry on this machine or its network (" + r.Seed.Ref + ")")
	case r.Apt.Mirror != base.Apt.Mirror:
		return refuse("another apt mirror (" + r.Apt.Mirror + ")")
	case r.Pip.Index != base.Pip.Index:
		return refuse("another pip index (" + r.Pip.Index + ")")
	case !slices.EqualFunc(r.Apt.Sources, base.Apt.Sources, func(a, b recipe.AptSource) bool {
		return a.URL == b.URL && a.Suite == b.Suite && a.Key == b.Key && slices.Equal(a.Components, b.Components)
	}):
		return refuse("other apt sources")
	case !slices.Equal(r.Grants, base.Grants):
		return refuse("other grants")
	}
	return nil
}

// privateHost says whether a registry reference's host is this machine or a private network's:
// localhost, or an address literal that is loopback, private, link-local or unspecified.
func privateHost(ref string) bool {
	host, _, _ := strings.Cut(ref, "/")
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && (ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsUnspecified())
}

// WorkshopRemoveRequest names a record to retire.
type WorkshopRemoveRequest struct {
	Name string `json:"name"`
}

// WorkshopRemoveResult says what was retired.
type WorkshopRemoveResult struct {
	Name    string `json:"name"`
	Version int    `json:"version"` // its current version when it was retired
}

// WorkshopRemove retires a record: it no longer lists nor launches; its versions are kept aside
// (workshops/.removed/). Its name's root is removed; its versions' roots stay, since a kept Bench of
// one holds no root of its own.
func (s *Service) WorkshopRemove(ctx context.Context, c *Call, req *WorkshopRemoveRequest) (*WorkshopRemoveResult, error) {
	cur, err := s.Records().Current(req.Name)
	if err != nil {
		return nil, err
	}
	if err := s.Records().Remove(req.Name); err != nil {
		return nil, err
	}
	c.wrote.Store(true)
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// Its name's root goes; the versions' roots (workshop-NAME-vN) stay with what still uses them
	// (a kept Bench holds no root of its own): `shed root rm` frees them.
	_ = st.RemoveRoot(req.Name)
	return &WorkshopRemoveResult{Name: req.Name, Version: cur.N}, nil
}

// WorkshopTagRequest sets tags on a version of a record (0: the current one) and removes others.
type WorkshopTagRequest struct {
	Name    string   `json:"name"`
	Version int      `json:"version,omitempty"`
	Tags    []string `json:"tags,omitempty"`
	Remove  []string `json:"remove,omitempty"`
}

// WorkshopTagsResult lists a record's tags.
type WorkshopTagsResult struct {
	Name string        `json:"name"`
	Tags []WorkshopTag `json:"tags"` // by name
}

// WorkshopTag is one tag of a record.
type WorkshopTag struct {
	Tag     string    `json:"tag"`
	Version int       `json:"version"`
	Time    time.Time `json:"time"`
}

// WorkshopTag sets and removes a record's tags.
func (s *Service) WorkshopTag(ctx context.Context, c *Call, req *WorkshopTagRequest) (*WorkshopTagsResult, error) {
	if _, err := s.Records().SetTags(req.Name, req.Version, req.Tags, req.Remove); err != nil {
		if errors.Is(err, records.ErrNoRecord) {
			return nil, err
		}
		return nil, usage("tags of lowercase letters, digits, '.', '_' and '-', and not \"default\" (always the current version)", "%v", err)
	}
	c.wrote.Store(true)
	return s.WorkshopTags(ctx, c, &WorkshopRequest{Name: req.Name})
}

// WorkshopTags lists a record's tags, "default" (its current version) among them.
func (s *Service) WorkshopTags(ctx context.Context, c *Call, req *WorkshopRequest) (*WorkshopTagsResult, error) {
	tags, err := s.Records().Tags(req.Name)
	if err != nil {
		return nil, err
	}
	res := &WorkshopTagsResult{Name: req.Name, Tags: []WorkshopTag{}}
	for t, v := range tags {
		res.Tags = append(res.Tags, WorkshopTag{Tag: t, Version: v.Version, Time: v.Time})
	}
	slices.SortFunc(res.Tags, func(a, b WorkshopTag) int { return strings.Compare(a.Tag, b.Tag) })
	return res, nil
}
