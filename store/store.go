package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/pelletier/go-toml/v2"
	"golang.org/x/sys/unix"
)

// DefaultRoot is where root's store lives unless --root or SHED_ROOT say otherwise.
const DefaultRoot = "/var/lib/toolshed"

// UserRoot is where an ordinary user's store lives by default (shed without root):
// $XDG_DATA_HOME/toolshed, else ~/.local/share/toolshed, as Nix and podman keep a user's data;
// "" if neither can be told.
func UserRoot() string {
	if d := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "toolshed")
	}
	if home, err := os.UserHomeDir(); err == nil && filepath.IsAbs(home) {
		return filepath.Join(home, ".local", "share", "toolshed")
	}
	return ""
}

// Sentinel errors, checked with errors.Is.
var (
	ErrNotExist       = errors.New("store path not valid")
	ErrCorrupt        = errors.New("store path corrupt")
	ErrNotInitialized = errors.New("store not initialized")
	ErrUnsafe         = errors.New("store directory unsafe")
	ErrRootNotExist   = errors.New("no such root")
)

// The directories of a store root. Each has one job; see docs/architecture.md.
const (
	dirStore = "store" // store paths and .drv files, immutable once renamed in
	// dirDB (db.go) holds the registration records (meta.db) and, sharded,
	// each path's manifest and provenance. Stores before it kept them in
	// dirLegacyMeta, which Open migrates (migrate.go).
	dirLegacyMeta = "meta"
	dirRoots      = "roots"     // named gc roots: one file per name holding a path
	dirTempRoots  = "temproots" // one file per live process, flock-held by it
	dirLocks      = "locks"     // per-path build locks and gc.lock
	dirTmp        = "tmp"       // staging directories, flock-held while in use
	dirTrash      = "trash"     // paths being deleted, moved here atomically first
	dirLogs       = "logs"      // <hash part>.log: the build log of a derived path
	fileConfig    = "config.toml"
	fileGCLock    = "gc.lock"
)

var layoutDirs = []string{dirStore, dirDB, dirRoots, dirTempRoots, dirLocks, dirTmp, dirTrash, dirLogs}

// dirLinks (links.go) is not in layoutDirs: a store made before it gets it on first use.

// Config is the store's config.toml.
type Config struct {
	// StoreDir is the logical store directory that path hashes are bound to.
	StoreDir string `toml:"store_dir"`
	// TrustedPublicKeys are the keys (NAME:BASE64) whose signed provenance makes a path that arrives
	// from elsewhere usable here; the store's own keys are trusted without being listed.
	TrustedPublicKeys []string `toml:"trusted_public_keys,omitempty"`
	// Substituters are caches (oci://HOST[:PORT]/REPO) that realize asks for missing paths before
	// building them.
	Substituters []string `toml:"substituters,omitempty"`
	// KeepBuildInputs makes gc keep the build inputs (the .debs and wheels) of the paths it keeps.
	// Off by default: a layer does not need them to run, they are 8-15% of what a Workshop's copy
	// ships (docs/benchmarks.md), and a rebuild fetches them again by their locked hashes. A store that serves as a mirror, or that must
	// rebuild a version gone upstream, turns it on (docs/architecture.md, "Build inputs").
	KeepBuildInputs bool `toml:"keep_build_inputs,omitempty"`
	// VerifyBeforeLaunch re-hashes a Workshop's layers before every Bench launch and refuses a damaged
	// one (what `bench run --verify` does once). Off by default: it reads every byte of the layers,
	// about 0.11 s per 100 MiB here, where a warm launch takes milliseconds.
	VerifyBeforeLaunch bool `toml:"verify_before_launch,omitempty"`
	// UppersSize is the size in bytes of the image shed makes for the uppers of the Benches that
	// branch (package upper), preallocated so that a full host disk never fails them: 0 is a quarter of
	// the store's free space, from 1 to 16 GiB. An image once made keeps its size.
	UppersSize int64 `toml:"uppers_size,omitempty"`
	// StoreFilesOnce makes identical files of different paths one file on disk (hard links into
	// links/, as `nix-store --optimise` does), without changing any path's content hash. On unless
	// set to false; `shed store optimise` does it for paths registered while it was off.
	StoreFilesOnce *bool `toml:"store_files_once,omitempty"`
}

// Config returns the store's configuration as it was when the store was opened.
func (s *Store) Config() Config { return s.config }

// UpdateConfig rewrites config.toml with what edit makes of it. Comments in the file are not kept.
func (s *Store) UpdateConfig(edit func(*Config) error) error {
	c := s.config
	c.TrustedPublicKeys = slices.Clone(c.TrustedPublicKeys)
	c.Substituters = slices.Clone(c.Substituters)
	if err := edit(&c); err != nil {
		return err
	}
	var b bytes.Buffer
	b.WriteString("# Toolshed store configuration (docs/architecture.md, docs/trust.md).\n")
	if err := toml.NewEncoder(&b).Encode(c); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(s.root, fileConfig), b.Bytes(), 0o600); err != nil {
		return err
	}
	s.config = c
	return nil
}

// Store is an open store root. It is safe for concurrent use by goroutines,
// and several processes may open the same root at once.
type Store struct {
	root   string
	config Config

	tempMu    sync.Mutex
	tempRoots *os.File // this process's temproots file, created on first use

	dbMu    sync.RWMutex // this process's side of db/lock: goroutines queue here, not in flock's backoff
	dbOpens atomic.Int64 // how many times this Store opened the database (DBOpens)

	attestor func(info *PathInfo, facts any) ([]byte, error)
}

// SetAttestor makes every path this Store registers carry the provenance attest returns (signed by
// the caller's key), written beside its record before the path becomes valid. Set it before use.
func (s *Store) SetAttestor(attest func(info *PathInfo, facts any) ([]byte, error)) {
	s.attestor = attest
}

// Init creates a store root (idempotently) with root-only permissions.
func Init(root string) (*Store, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create store root %s: %w", root, err)
	}
	// MkdirAll leaves an existing root alone; tighten it, since the store holds
	// setuid binaries and device nodes that no other user may reach.
	if err := os.Chmod(root, 0o700); err != nil {
		return nil, fmt.Errorf("chmod store root %s: %w", root, err)
	}
	for _, d := range layoutDirs {
		p := filepath.Join(root, d)
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("create %s: %w", p, err)
		}
	}
	cfgPath := filepath.Join(root, fileConfig)
	if _, err := os.Stat(cfgPath); errors.Is(err, fs.ErrNotExist) {
		data := []byte("# Toolshed store configuration (see docs/architecture.md).\n" +
			"# store_dir binds path hashes to a logical store directory; keep the default\n" +
			"# so that stores on other machines and roots can share paths.\n" +
			fmt.Sprintf("store_dir = %q\n", DefaultStoreDir))
		if err := writeFileAtomic(cfgPath, data, 0o600); err != nil {
			return nil, err
		}
	}
	if err := syncDir(root); err != nil {
		return nil, err
	}
	if err := createDB(root); err != nil {
		return nil, err
	}
	return Open(root)
}

// Initialized says whether root holds a store `shed init` made (its config.toml exists), without
// opening it: shed asks it of a user's own store to decide where that user's commands go.
func Initialized(root string) bool {
	fi, err := os.Lstat(filepath.Join(root, fileConfig))
	return err == nil && fi.Mode().IsRegular()
}

// Open opens an existing store root and checks that it is safe to use.
func Open(root string) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", root, err)
	}
	s := &Store{root: abs}
	data, err := os.ReadFile(filepath.Join(abs, fileConfig))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no %s", ErrNotInitialized, abs, fileConfig)
	} else if err != nil {
		return nil, fmt.Errorf("open store %s: %w", abs, err)
	}
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&s.config); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(abs, fileConfig), err)
	}
	if s.config.StoreDir == "" {
		s.config.StoreDir = DefaultStoreDir
	}
	if err := s.migrateLegacyMeta(); err != nil {
		return nil, err
	}
	for _, d := range append([]string{"."}, layoutDirs...) {
		if err := checkPrivateDir(filepath.Join(abs, d)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// checkPrivateDir refuses a store directory that another user could write to
// or that is owned by someone else: whoever can write there can swap the
// bytes every Bench runs.
func checkPrivateDir(p string) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%w: %s is missing", ErrNotInitialized, p)
		}
		return fmt.Errorf("stat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%w: %s is not a directory", ErrUnsafe, p)
	}
	if int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s is owned by uid %d, not %d", ErrUnsafe, p, st.Uid, os.Geteuid())
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by group or others (mode %04o)", ErrUnsafe, p, st.Mode&0o7777)
	}
	return nil
}

// Root returns the absolute store root.
func (s *Store) Root() string { return s.root }

// StoreDir returns the logical store directory that path hashes are bound to.
func (s *Store) StoreDir() string { return s.config.StoreDir }

// Location returns where p lives on disk.
func (s *Store) Location(p Path) string { return filepath.Join(s.root, dirStore, p.String()) }

// LogFile is where the build log of p is kept (`shed log`). Logs are not part
// of the path: they are never hashed, shared or trusted.
func (s *Store) LogFile(p Path) string {
	return filepath.Join(s.root, dirLogs, p.HashPart()+".log")
}

// TmpDir is the store's staging directory: on the store's filesystem, so that
// what is built there can be renamed into place.
func (s *Store) TmpDir() string { return filepath.Join(s.root, dirTmp) }

func (s *Store) provenanceFile(p Path) string {
	return filepath.Join(s.shardDir(p), p.HashPart()+".provenance")
}

func (s *Store) manifestFile(p Path) string {
	return filepath.Join(s.shardDir(p), p.HashPart()+".manifest")
}

// Close releases this process's temporary roots.
func (s *Store) Close() error {
	s.tempMu.Lock()
	defer s.tempMu.Unlock()
	if s.tempRoots == nil {
		return nil
	}
	name := s.tempRoots.Name()
	err := os.Remove(name)
	if cerr := s.tempRoots.Close(); err == nil {
		err = cerr
	}
	s.tempRoots = nil
	return err
}

// checkCtx is a small helper for loops that should stop when ctx is done.
func checkCtx(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return nil
}
