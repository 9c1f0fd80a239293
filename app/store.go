package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

func init() {
	op("init", (*Service).Init)
	op("store.ls", (*Service).StoreList)
	op("store.info", (*Service).StoreInfo)
	op("store.verify", (*Service).Verify)
	op("store.stats", (*Service).StoreStats)
	op("store.optimise", (*Service).Optimise)
	op("store.sign", (*Service).Sign)
	op("store.add", (*Service).StoreAdd)
	op("root.add", (*Service).RootAdd)
	op("root.ls", (*Service).RootList)
	op("root.rm", (*Service).RootRemove)
	op("gc", (*Service).GC)
	op("log", (*Service).BuildLog)
	op("key.show", (*Service).KeyShow)
	op("key.rotate", (*Service).KeyRotate)
	op("key.trust", (*Service).KeyTrust)
	op("key.untrust", (*Service).KeyUntrust)
	op("copy", (*Service).Copy)
	op("import", (*Service).Import)
}

// InitRequest asks to create the store (idempotent).
type InitRequest struct {
	KeyName string `json:"key_name,omitempty"` // the signing key's name (default: HOSTNAME-XXXXXX-1, a random suffix)
}

// InitResult is the store made (or found).
type InitResult struct {
	Root      string `json:"root"`       // the store root
	StoreDir  string `json:"store_dir"`  // the logical store directory paths are named under
	PublicKey string `json:"public_key"` // the signing key's public half, NAME:BASE64
	NewKey    bool   `json:"new_key"`    // whether the signing key was made now
}

// Init creates the store with its signing key; on an existing store it tightens permissions and
// makes the key if there is none.
func (s *Service) Init(ctx context.Context, c *Call, req *InitRequest) (*InitResult, error) {
	st, err := store.Init(s.Root)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	name := req.KeyName
	if name == "" {
		name = defaultKeyName()
	}
	key, made, err := trust.OpenKeys(st.Root()).Ensure(name)
	if err != nil {
		return nil, err
	}
	return &InitResult{Root: st.Root(), StoreDir: st.StoreDir(), PublicKey: key.Public().String(), NewKey: made}, nil
}

// defaultKeyName names a store's first key after the host, as Nix's cache keys are named, with a
// random suffix: two stores on one host (or on two hosts of one name, as cloned machines are) must
// not have keys of the same name, or "signed by host-1" could not tell them apart.
func defaultKeyName() string {
	h, _ := os.Hostname()
	h = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '-'
	}, h)
	if h == "" || strings.Trim(h, ".-") != h {
		h = "shed"
	}
	if len(h) > 53 {
		h = h[:53]
	}
	var b [3]byte
	_, _ = rand.Read(b[:]) // crypto/rand: never fails on Linux
	return fmt.Sprintf("%s-%x-1", h, b)
}

// PathInfo is what the store records about a path; locations are absolute.
type PathInfo struct {
	Path        string     `json:"path"`              // the base name, HASH-NAME
	Location    string     `json:"location"`          // where it is
	ContentHash store.Hash `json:"content_hash"`      // BLAKE3 of the path's manifest
	Size        int64      `json:"size"`              // bytes
	Registered  time.Time  `json:"registered"`        // when it was registered
	Deriver     string     `json:"deriver,omitempty"` // the .drv that built it
	References  []string   `json:"references"`        // the paths it needs at run time
	// BuildInputs are the paths it was built from and does not need to run (.debs, wheels), each
	// with whether it is still in the store (gc frees them unless the store keeps build inputs).
	BuildInputs []BuildInput `json:"build_inputs"`
	CA          string       `json:"ca,omitempty"` // the content address, for paths added by content
	// Shared is the bytes of its files that are stored once with other paths (store info only).
	Shared int64 `json:"shared,omitempty"`
}

func pathInfo(st *store.Store, info *store.PathInfo) *PathInfo {
	j := &PathInfo{Path: info.Path.String(), Location: st.Location(info.Path), ContentHash: info.ContentHash,
		Size: info.Size, Registered: info.Registered, References: []string{}, CA: info.CA}
	if !info.Deriver.IsZero() {
		j.Deriver = st.Location(info.Deriver)
	}
	for _, r := range info.References {
		j.References = append(j.References, st.Location(r))
	}
	j.BuildInputs = []BuildInput{}
	for _, r := range info.BuildInputs {
		j.BuildInputs = append(j.BuildInputs, BuildInput{Path: st.Location(r), Present: st.IsValid(r)})
	}
	return j
}

// BuildInput is a path another was built from.
type BuildInput struct {
	Path    string `json:"path"`
	Present bool   `json:"present"` // still in the store
}

// parsePath accepts a store path as a base name or as a file name under the store directory.
func parsePath(st *store.Store, arg string) (store.Path, error) {
	p, err := store.ParsePath(strings.TrimPrefix(arg, st.StoreDir()+"/"))
	if err != nil {
		return store.Path{}, err
	}
	if arg != p.String() && arg != st.Location(p) {
		return store.Path{}, usage("pass a path under "+st.StoreDir()+" or its base name", "%s is not in the store at %s", arg, st.Root())
	}
	return p, nil
}

// StoreListRequest asks for the valid store paths.
type StoreListRequest struct{}

// PathsResult lists paths.
type PathsResult struct {
	Paths []*PathInfo `json:"paths"` // the paths
}

// StoreList lists the valid paths: registered and present on disk.
func (s *Service) StoreList(ctx context.Context, c *Call, req *StoreListRequest) (*PathsResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	infos, _, err := st.All()
	if err != nil {
		return nil, err
	}
	res := &PathsResult{Paths: []*PathInfo{}}
	for _, p := range store.SortedPaths(infos) {
		if st.IsValid(p) {
			res.Paths = append(res.Paths, pathInfo(st, infos[p]))
		}
	}
	return res, nil
}

// PathRequest names a store path.
type PathRequest struct {
	Path string `json:"path"` // a store path: its base name or its location
}

// StoreInfo returns what the store records about a path.
func (s *Service) StoreInfo(ctx context.Context, c *Call, req *PathRequest) (*PathInfo, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	p, err := parsePath(st, req.Path)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(p)
	if err != nil {
		return nil, err
	}
	j := pathInfo(st, info)
	if j.Shared, err = st.SharedBytes(p); err != nil {
		return nil, err
	}
	return j, nil
}

// StoreStatsRequest asks what the store holds.
type StoreStatsRequest struct{}

// StoreStats is what the store holds, and what storing files once saves.
type StoreStats struct {
	Root  string `json:"root"`  // the store root
	Paths int    `json:"paths"` // valid paths
	Size  int64  `json:"size"`  // the bytes of their regular files, as copies would take
	// Disk is Size less Links.Saved: what the paths' files take on disk.
	Disk        int64           `json:"disk"`
	FilesOnce   bool            `json:"store_files_once"` // new paths have their files stored once
	Links       store.LinkStats `json:"links"`
	Substitutes []string        `json:"substituters"`
}

// StoreStats counts the store's paths and bytes, and what storing files once saves.
func (s *Service) StoreStats(ctx context.Context, c *Call, req *StoreStatsRequest) (*StoreStats, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	infos, _, err := st.All()
	if err != nil {
		return nil, err
	}
	res := &StoreStats{Root: st.Root(), FilesOnce: st.LinkFilesOnce(), Substitutes: slices.Clone(st.Config().Substituters)}
	if res.Substitutes == nil {
		res.Substitutes = []string{}
	}
	for p, info := range infos {
		if st.IsValid(p) {
			res.Paths++
			res.Size += info.Size
		}
	}
	links, err := st.Links(ctx)
	if err != nil {
		return nil, err
	}
	res.Links = *links
	res.Disk = res.Size - links.Saved
	return res, nil
}

// OptimiseRequest asks to store the files of the store's paths once.
type OptimiseRequest struct{}

// OptimiseResult is what an optimise did, and what storing files once saves now.
type OptimiseResult struct {
	store.OptimiseResult
	Links store.LinkStats `json:"links"`
}

// Optimise stores identical files of the store's paths once (hard links into links/), for paths
// registered before the store did it or while its config said not to.
func (s *Service) Optimise(ctx context.Context, c *Call, req *OptimiseRequest) (*OptimiseResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	status := c.IO.Status
	if status != nil {
		status.Begin("storing identical files once")
		defer status.End()
	}
	res, err := st.Optimise(ctx, func(done, total int) {
		if status != nil {
			status.Write([]byte(fmt.Sprintf("%d of %d paths\n", done, total)))
		}
	})
	if err != nil {
		return nil, err
	}
	c.wrote.Store(true)
	links, err := st.Links(ctx)
	if err != nil {
		return nil, err
	}
	return &OptimiseResult{OptimiseResult: *res, Links: *links}, nil
}

// VerifyRequest asks to check the store (or the named paths).
type VerifyRequest struct {
	Paths         []string `json:"paths,omitempty"`          // store paths (none: all)
	CheckContents bool     `json:"check_contents,omitempty"` // re-hash every file
	// Repair re-hashes every file and puts back the registered bytes of each damaged or missing path
	// (from a cache, a download or a rebuild), then checks those paths again.
	Repair bool `json:"repair,omitempty"`
	// Substituters are caches a repair asks first, besides the store's.
	Substituters []string `json:"substituters,omitempty"`
	Offline      bool     `json:"offline,omitempty"` // a repair never touches the network
}

// VerifyResult is what a verify found (after a repair, what is still wrong) and what it repaired.
type VerifyResult struct {
	store.VerifyResult
	Repaired []RepairedPath `json:"repaired,omitempty"` // with Repair: every damaged path, and how it went
}

// RepairedPath is one damaged path a repair tried to put back.
type RepairedPath struct {
	Path  string `json:"path"`
	How   string `json:"how,omitempty"`   // substituted, fetched or rebuilt
	Error string `json:"error,omitempty"` // why it is still damaged
}

// Verify checks records, presence, references and provenance (and with CheckContents every file);
// with Repair, it also puts back the bytes of the damaged paths.
func (s *Service) Verify(ctx context.Context, c *Call, req *VerifyRequest) (*VerifyResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	t, err := s.openTrust(st)
	if err != nil {
		return nil, err
	}
	opts := store.VerifyOptions{CheckContents: req.CheckContents, CheckProvenance: t.Verify}
	for _, a := range req.Paths {
		p, err := parsePath(st, a)
		if err != nil {
			return nil, err
		}
		opts.Paths = append(opts.Paths, p)
	}
	opts.CheckContents = opts.CheckContents || req.Repair
	res, err := st.Verify(ctx, opts)
	if res == nil {
		return nil, err
	}
	if err != nil || !req.Repair {
		return &VerifyResult{VerifyResult: *res}, err
	}
	var damaged []store.Path
	for _, pr := range res.Problems {
		if pr.Damaged && !slices.Contains(damaged, pr.Path) {
			damaged = append(damaged, pr.Path)
		}
	}
	out := &VerifyResult{VerifyResult: *res, Repaired: []RepairedPath{}}
	if len(damaged) == 0 {
		return out, nil
	}
	b := s.newBuilder(c, st, req.Offline)
	if b.Substituter, err = s.substituter(c, st, req.Substituters); err != nil {
		return nil, err
	}
	repaired, err := b.Repair(ctx, damaged)
	if err != nil {
		return nil, err
	}
	for _, r := range repaired {
		rp := RepairedPath{Path: st.Location(r.Path), How: r.How}
		if r.Err != nil {
			rp.How, rp.Error = "", r.Err.Error()
		}
		out.Repaired = append(out.Repaired, rp)
	}
	// What is wrong now: the other problems as found, and those of the damaged paths checked again.
	again, err := st.Verify(ctx, store.VerifyOptions{CheckContents: true, CheckProvenance: t.Verify, Paths: damaged})
	if err != nil {
		return nil, err
	}
	out.Problems = slices.DeleteFunc(out.Problems, func(pr store.Problem) bool { return slices.Contains(damaged, pr.Path) })
	out.Problems = append(out.Problems, again.Problems...)
	return out, nil
}

// SignRequest names paths to sign (none: every path whose provenance does not verify).
type SignRequest struct {
	Paths []string `json:"paths,omitempty"` // store paths (none: every path whose provenance does not verify)
}

// SignResult lists the paths signed and the key.
type SignResult struct {
	Signed []store.Path `json:"signed"` // the paths signed
	Key    string       `json:"key"`    // the key signed with, NAME:BASE64
}

// Sign signs paths' provenance with the store's current key.
func (s *Service) Sign(ctx context.Context, c *Call, req *SignRequest) (*SignResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	t, err := s.openTrust(st)
	if err != nil {
		return nil, err
	}
	paths := []store.Path{}
	for _, a := range req.Paths {
		p, err := parsePath(st, a)
		if err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	if len(paths) == 0 {
		infos, _, err := st.All()
		if err != nil {
			return nil, err
		}
		for _, p := range store.SortedPaths(infos) {
			prov, _ := st.Provenance(p)
			if t.Verify(infos[p], prov) != nil {
				paths = append(paths, p)
			}
		}
	}
	for _, p := range paths {
		if err := t.Resign(ctx, p); err != nil {
			return nil, err
		}
	}
	return &SignResult{Signed: paths, Key: t.Key.Public().String()}, nil
}

// StoreAddRequest asks to copy a directory or file into the store, addressed by its content.
type StoreAddRequest struct {
	Dir  string `json:"dir"`            // a directory or file of the caller's
	Name string `json:"name,omitempty"` // default: the base name of Dir
}

var badNameChars = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[^A-Za-z0-9+._?=-]+`) })

// storeName turns a file name into a valid store name.
func storeName(base string) string {
	n := strings.TrimLeft(badNameChars().ReplaceAllString(base, "-"), ".")
	if n == "" || n == "-" {
		return "source"
	}
	if len(n) > store.MaxNameLen {
		n = n[:store.MaxNameLen]
	}
	return n
}

// StoreAdd copies a directory into the store.
func (s *Service) StoreAdd(ctx context.Context, c *Call, req *StoreAddRequest) (*PathInfo, error) {
	src := c.path(req.Dir)
	name := req.Name
	if name == "" {
		name = storeName(filepath.Base(src))
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// The store's own state (a Bench's upper above all) never becomes a path: a path can be pushed
	// to a cache, an upper must never leave the machine.
	if rel, err := filepath.Rel(st.Root(), src); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return nil, usage("store paths come from builds; a Bench's upper layer is never added to the store or exported",
			"%s is inside the store root %s", src, st.Root())
	}
	info, err := st.AddDir(ctx, src, name, nil)
	if err != nil {
		return nil, err
	}
	return pathInfo(st, info), nil
}

// RootAddRequest asks to make Name a root for Path.
type RootAddRequest struct {
	Name string `json:"name"` // the root's name
	Path string `json:"path"` // the store path it keeps
}

// Root is a named gc root.
type Root struct {
	Name     string     `json:"name"`     // the root's name
	Path     store.Path `json:"path"`     // the path's base name
	Location string     `json:"location"` // the path's location
}

// RootAdd makes a named root (replacing one of that name).
func (s *Service) RootAdd(ctx context.Context, c *Call, req *RootAddRequest) (*Root, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	p, err := parsePath(st, req.Path)
	if err != nil {
		return nil, err
	}
	if err := st.AddRoot(ctx, req.Name, p); err != nil {
		return nil, err
	}
	return &Root{Name: req.Name, Path: p, Location: st.Location(p)}, nil
}

// RootListRequest asks for the named roots.
type RootListRequest struct{}

// RootsResult lists roots.
type RootsResult struct {
	Roots []Root `json:"roots"` // the named roots
}

// RootList lists the named roots.
func (s *Service) RootList(ctx context.Context, c *Call, req *RootListRequest) (*RootsResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	roots, err := st.Roots()
	if err != nil {
		return nil, err
	}
	res := &RootsResult{Roots: []Root{}}
	for _, r := range roots {
		res.Roots = append(res.Roots, Root{Name: r.Name, Path: r.Path, Location: st.Location(r.Path)})
	}
	return res, nil
}

// RootRequest names a root.
type RootRequest struct {
	Name string `json:"name"` // the root's name
}

// Empty is the result of an operation that returns nothing but success.
type Empty struct{}

// RootRemove removes a named root (the paths stay until gc) and returns what it was.
func (s *Service) RootRemove(ctx context.Context, c *Call, req *RootRequest) (*Root, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	res := &Root{Name: req.Name}
	if roots, err := st.Roots(); err == nil { // a damaged root elsewhere does not stop this one's removal
		for _, r := range roots {
			if r.Name == req.Name {
				res.Path, res.Location = r.Path, st.Location(r.Path)
			}
		}
	}
	if err := st.RemoveRoot(req.Name); err != nil {
		return nil, err
	}
	return res, nil
}

// GCRequest asks to delete the paths no root needs.
type GCRequest struct {
	DryRun   bool  `json:"dry_run,omitempty"`   // say what would be deleted, delete nothing
	MaxFreed int64 `json:"max_freed,omitempty"` // bytes; 0: no limit
}

// GCResult is what gc deleted (or would).
type GCResult struct {
	store.GCResult
	Locations []string `json:"locations"` // the deleted paths' locations
}

// GC deletes every path no root, temporary root or live path needs, and sweeps debris.
func (s *Service) GC(ctx context.Context, c *Call, req *GCRequest) (*GCResult, error) {
	if req.MaxFreed < 0 {
		return nil, usage("a size in bytes", "max_freed %d", req.MaxFreed)
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	res, err := st.GC(ctx, store.GCOptions{DryRun: req.DryRun, MaxFreed: req.MaxFreed})
	if err != nil {
		return nil, err
	}
	return &GCResult{GCResult: *res, Locations: locations(st, res.Deleted)}, nil
}

// BuildLog returns the build log of a store path.
func (s *Service) BuildLog(ctx context.Context, c *Call, req *PathRequest) (*TextResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	p, err := parsePath(st, req.Path)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(st.LogFile(p))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fail(CodeNotFound, errors.New("no build log for "+p.String()),
			"only paths built on this machine have logs: fetched and added paths have none")
	} else if err != nil {
		return nil, err
	}
	defer f.Close()
	return readText(f)
}

// KeyShowRequest asks for the store's keys.
type KeyShowRequest struct{}

// KeysResult is the signing key's public half, the retired keys and the trusted keys.
type KeysResult struct {
	PublicKey string   `json:"public_key"` // the signing key's public half, NAME:BASE64
	Retired   []string `json:"retired"`    // public halves of rotated keys
	Trusted   []string `json:"trusted"`    // keys trusted for paths from caches and imports
}

// KeyShow returns the store's public keys: signing, retired, trusted.
func (s *Service) KeyShow(ctx context.Context, c *Call, req *KeyShowRequest) (*KeysResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	t, err := s.openTrust(st)
	if err != nil {
		return nil, err
	}
	retired, err := t.Keys.Retired()
	if err != nil {
		return nil, err
	}
	res := &KeysResult{PublicKey: t.Key.Public().String(), Retired: []string{}, Trusted: slices.Clone(st.Config().TrustedPublicKeys)}
	if res.Trusted == nil {
		res.Trusted = []string{}
	}
	for _, k := range retired {
		res.Retired = append(res.Retired, k.String())
	}
	return res, nil
}

// KeyRotateRequest asks for a new signing key.
type KeyRotateRequest struct {
	Name   string `json:"name,omitempty"`   // default: the old name with its number increased
	Resign bool   `json:"resign,omitempty"` // sign every path again with the new key
}

// KeyRotateResult is the retired key and the new one.
type KeyRotateResult struct {
	Old      string `json:"old"`      // the retired key's public half (still trusted for what it signed)
	New      string `json:"new"`      // the new signing key's public half
	Resigned int    `json:"resigned"` // paths signed again
}

// KeyRotate replaces the signing key; the old public half stays trusted for what it signed.
func (s *Service) KeyRotate(ctx context.Context, c *Call, req *KeyRotateRequest) (*KeyRotateResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	t, err := s.openTrust(st)
	if err != nil {
		return nil, err
	}
	name := req.Name
	if name == "" {
		name = nextKeyName(t.Key.Name)
	}
	old, cur, err := t.Keys.Rotate(name)
	if err != nil {
		return nil, err
	}
	res := &KeyRotateResult{Old: old.String(), New: cur.Public().String()}
	if req.Resign {
		t2, err := s.openTrust(st)
		if err != nil {
			return nil, err
		}
		infos, _, err := st.All()
		if err != nil {
			return nil, err
		}
		for _, p := range store.SortedPaths(infos) {
			if err := t2.Resign(ctx, p); err != nil {
				return nil, err
			}
			res.Resigned++
		}
	}
	return res, nil
}

// nextKeyName turns host-1 into host-2 (and a name without a number into name-2).
func nextKeyName(name string) string {
	i := len(name)
	for i > 0 && name[i-1] >= '0' && name[i-1] <= '9' {
		i--
	}
	n := 0
	fmt.Sscan(name[i:], &n)
	if i == len(name) || i == 0 || name[i-1] != '-' {
		return name + "-2"
	}
	return fmt.Sprintf("%s%d", name[:i], n+1)
}

// KeyRequest names a key: NAME:BASE64 (trust), or NAME or NAME:BASE64 (untrust).
type KeyRequest struct {
	Key string `json:"key"` // NAME:BASE64 (or, to untrust, NAME)
}

// KeyResult is what key.trust or key.untrust changed.
type KeyResult struct {
	Keys    []string `json:"keys"`    // the key trusted, or the keys no longer trusted (NAME:BASE64)
	Changed bool     `json:"changed"` // false: the key was trusted already
}

// KeyTrust trusts a public key for paths from caches and imports.
func (s *Service) KeyTrust(ctx context.Context, c *Call, req *KeyRequest) (*KeyResult, error) {
	k, err := trust.ParsePublicKey(req.Key)
	if err != nil {
		return nil, fail(CodeUsage, err, "`shed key export` on the signing store prints its public key")
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	res := &KeyResult{Keys: []string{k.String()}}
	err = st.UpdateConfig(func(cfg *store.Config) error {
		if !slices.Contains(cfg.TrustedPublicKeys, k.String()) {
			cfg.TrustedPublicKeys, res.Changed = append(cfg.TrustedPublicKeys, k.String()), true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// KeyUntrust stops trusting a key.
func (s *Service) KeyUntrust(ctx context.Context, c *Call, req *KeyRequest) (*KeyResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	res := &KeyResult{Keys: []string{}}
	err = st.UpdateConfig(func(cfg *store.Config) error {
		cfg.TrustedPublicKeys = slices.DeleteFunc(cfg.TrustedPublicKeys, func(k string) bool {
			pk, err := trust.ParsePublicKey(k)
			match := k == req.Key || (err == nil && pk.Name == req.Key)
			if match {
				res.Keys = append(res.Keys, k)
			}
			return match
		})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(res.Keys) == 0 {
		return nil, fail(CodeNotFound, fmt.Errorf("no trusted key %q", req.Key), "`shed key show` lists the trusted keys")
	}
	res.Changed = true
	return res, nil
}

// CopyRequest asks to push store paths (with their closures) to a cache. Items are store paths or
// Workshops (a record or a recipe file: its realized layers); none means ./workshop.toml.
type CopyRequest struct {
	To    string   `json:"to"`              // oci://HOST[:PORT]/REPO or oci-layout:DIR
	Items []string `json:"items,omitempty"` // store paths, or Workshops (their realized layers)
	// BuildInputs adds the paths the layers were built from (.debs, wheels) to what they need to run.
	BuildInputs bool `json:"build_inputs,omitempty"`
	// Image, if set, also pushes the one Workshop in Items as an OCI image tagged Image in the same
	// repository: one layer per store path, each annotated with its path (docs/kubernetes.md).
	Image string `json:"image,omitempty"`
}

// CopyResult is what was pushed.
type CopyResult struct {
	Cache   string   `json:"cache"`   // the cache, as named
	Pushed  []string `json:"pushed"`  // paths pushed
	Present []string `json:"present"` // paths already there with the same provenance
	Bytes   int64    `json:"bytes"`   // compressed bytes of the trees pushed
	// Image is the Workshop's image, when the request asked for one.
	Image *CopiedImage `json:"image,omitempty"`
}

// CopiedImage is a Workshop pushed as an OCI image.
type CopiedImage struct {
	Ref    string `json:"ref"`    // REPO:TAG, what a pod's image names
	Digest string `json:"digest"` // the manifest's digest (REPO@DIGEST pins it)
	Layers int    `json:"layers"` // one per store path
	Bytes  int64  `json:"bytes"`  // compressed bytes of the layers pushed now
}

// Copy pushes paths and their reference closures to a cache, one OCI artifact each.
func (s *Service) Copy(ctx context.Context, c *Call, req *CopyRequest) (*CopyResult, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	t, err := s.openTrust(st)
	if err != nil {
		return nil, err
	}
	var img *imageOf
	if req.Image != "" {
		if img, err = s.imageOf(ctx, c, st, req); err != nil {
			return nil, err
		}
	}
	paths, err := s.pathsOf(ctx, c, st, req.Items)
	if err != nil {
		return nil, err
	}
	cc, err := cache.Open(s.cacheName(c, req.To))
	if err != nil {
		return nil, fail(CodeUsage, err, "a cache is oci://HOST[:PORT]/REPO or oci-layout:DIR")
	}
	res, err := cache.Push(ctx, st, t, cc, paths, req.BuildInputs)
	if errors.Is(err, store.ErrNotExist) && req.BuildInputs {
		return nil, fail(CodeNotFound, err, "`shed realize --check` fetches a layer's build inputs again; keep_build_inputs = true in the store's config.toml keeps them from gc")
	}
	if err != nil {
		return nil, err
	}
	out := &CopyResult{Cache: req.To, Pushed: locations(st, res.Pushed), Present: locations(st, res.Present), Bytes: res.Bytes}
	if img != nil {
		// After the paths: a node that pulls the image finds every path it names in the cache.
		ir, err := cache.PushImage(ctx, st, cc, req.Image, img.layers, img.config)
		if err != nil {
			return nil, err
		}
		repo := strings.TrimPrefix(req.To, "oci://")
		out.Image = &CopiedImage{Ref: repo + ":" + req.Image, Digest: ir.Digest.String(), Layers: ir.Layers, Bytes: ir.Bytes}
	}
	return out, nil
}

// imageOf is what a Workshop image is made of.
type imageOf struct {
	layers []store.Path
	config cache.ImageConfig
}

// imageOf reads the one Workshop of a copy that asks for an image: its layers, bottom first, and
// the config a pod runs it with (its [env], workdir and user, as a Bench would).
func (s *Service) imageOf(ctx context.Context, c *Call, st *store.Store, req *CopyRequest) (*imageOf, error) {
	if err := checkImageTag(req.Image); err != nil {
		return nil, usage("a tag is up to 128 letters, digits, '_', '.' and '-', not starting with '.' or '-'", "%v", err)
	}
	items := req.Items
	if len(items) == 0 {
		items = []string{DefaultRecipe}
	}
	if len(items) != 1 {
		return nil, usage("name the one Workshop the image is of", "--image makes an image of one Workshop, not of %d items", len(items))
	}
	if _, err := parsePath(st, items[0]); err == nil {
		return nil, usage("name a Workshop (a record or a recipe file): its layers are the image's", "--image makes an image of a Workshop, not of the store path %s", items[0])
	}
	r, err := s.loadRecipe(c, items[0])
	if err != nil {
		return nil, err
	}
	plan, _, err := s.lockedPlan(ctx, c, st, r, true)
	if err != nil {
		return nil, err
	}
	cfg := cache.ImageConfig{
		Env:        append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}, r.Environ()...),
		WorkingDir: r.Workdir,
		User:       r.User,
		Cmd:        []string{"/bin/sh"},
	}
	return &imageOf{layers: plan.Layers, config: cfg}, nil
}

// checkImageTag applies the OCI distribution spec's grammar of a tag.
func checkImageTag(tag string) error {
	if len(tag) > 128 || tag == "" || tag[0] == '.' || tag[0] == '-' {
		return fmt.Errorf("bad image tag %q", tag)
	}
	for _, r := range tag {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-') {
			return fmt.Errorf("bad image tag %q", tag)
		}
	}
	return nil
}

// pathsOf turns items into store paths: a store path as itself, a Workshop as its realized layers.
func (s *Service) pathsOf(ctx context.Context, c *Call, st *store.Store, items []string) ([]store.Path, error) {
	if len(items) == 0 {
		items = []string{DefaultRecipe}
	}
	var out []store.Path
	for _, a := range items {
		if p, err := parsePath(st, a); err == nil {
			if !st.IsValid(p) {
				return nil, fail(CodeNotFound, fmt.Errorf("%s: %w", p, store.ErrNotExist), "`shed store ls` lists the valid paths")
			}
			out = append(out, p)
			continue
		}
		if fi, err := os.Stat(c.path(a)); err == nil && fi.IsDir() {
			return nil, usage("only store paths, and a Workshop's realized layers, can be copied; a Bench's upper layer never can",
				"%s is neither a store path nor a recipe file", a)
		}
		r, err := s.loadRecipe(c, a)
		if err != nil {
			if refused := s.taskState(c, st, a, "copied or exported"); refused != nil {
				return nil, refused
			}
			return nil, err
		}
		plan, _, err := s.lockedPlan(ctx, c, st, r, true)
		if err != nil {
			return nil, err
		}
		for _, l := range plan.Layers {
			if !st.IsValid(l) {
				return nil, fail(CodeFailed, fmt.Errorf("%s is not realized (%s is missing)", a, l), "run `shed realize "+a+"` first")
			}
		}
		out = append(out, plan.Layers...)
	}
	return out, nil
}

// ImportRequest asks to take paths from an OCI layout directory (all of them, or the named ones).
type ImportRequest struct {
	Dir   string   `json:"dir"`             // the OCI layout directory (written by `copy` to oci-layout:DIR)
	Paths []string `json:"paths,omitempty"` // base names of the paths to import (default: all)
}

// ImportResult is what was imported.
type ImportResult struct {
	Imported []string `json:"imported"` // paths registered now, with their references
	Present  []string `json:"present"`  // paths that were valid here already
}

// Import registers paths from a layout directory, each only if a trusted key signed it and its
// bytes re-hash to what was signed.
func (s *Service) Import(ctx context.Context, c *Call, req *ImportRequest) (*ImportResult, error) {
	dir := c.path(req.Dir)
	if _, err := os.Stat(dir); err != nil {
		return nil, fail(CodeUsage, err, "DIR is a directory written by `shed export --oci DIR`")
	}
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	t, err := s.openTrust(st)
	if err != nil {
		return nil, err
	}
	cc, err := cache.Open("oci-layout:" + dir)
	if err != nil {
		return nil, err
	}
	var paths []store.Path
	if len(req.Paths) > 0 {
		for _, a := range req.Paths {
			p, err := store.ParsePath(strings.TrimPrefix(a, st.StoreDir()+"/"))
			if err != nil {
				return nil, fail(CodeUsage, err, "name paths by their base name (HASH-NAME)")
			}
			paths = append(paths, p)
		}
	} else {
		tags, err := cc.Tags(ctx)
		if err != nil {
			return nil, err
		}
		for _, tag := range tags {
			p, err := cc.PathOf(ctx, st, tag)
			if err != nil {
				return nil, err
			}
			paths = append(paths, p)
		}
	}
	pl := &cache.Puller{Store: st, Trust: t, Caches: []*cache.Cache{cc}}
	var imported, present []store.Path
	for _, p := range paths {
		if st.IsValid(p) {
			present = append(present, p)
			continue
		}
		ok, err := pl.Pull(ctx, p, nil, nil)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fail(CodeNotFound, fmt.Errorf("%s is not in %s", p, dir), "")
		}
		imported = append(imported, p)
	}
	return &ImportResult{Imported: locations(st, imported), Present: locations(st, present)}, nil
}
