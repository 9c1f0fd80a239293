// Package snapshotter is containerd's snapshotter over the node's shed store: a proxy plugin that
// serves containerd's snapshots API (containerd.services.snapshots.v1, gRPC on a unix socket), so
// that an image whose layers are store paths (`shed copy --image`) is mounted from the store as a
// Bench's lowers are, without a layer downloaded (issue 29).
//
// A layer whose descriptor names a store path (the label cache.SnapshotPathLabel, which containerd
// passes from the layer's annotations) becomes a committed snapshot made at once: the path is made
// valid (from the store's substituters, signatures checked, when it is missing), its layer digest
// checked against the image's, held by a gc root, and Prepare answers "already exists", which tells
// containerd not to fetch the layer. Every other layer (a plain image's) is unpacked by containerd
// into a directory of the snapshotter's own, as containerd's overlayfs snapshotter does. A
// container's snapshot is one overlay: the store paths and unpacked layers below, one writable
// upper.
package snapshotter

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/api/types"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/internal/hint"
)

// Labels containerd sets.
const (
	// refLabel is the chain ID a layer's snapshot is committed as (containerd's unpacker sets it).
	refLabel = "containerd.io/snapshot.ref"
)

// Store is what the snapshotter needs of the node's shed store (package app provides it).
type Store interface {
	// Layer makes the store path named full valid (substituted from a trusted cache when missing).
	Layer(ctx context.Context, full string) error
	// DiffID is the digest of the valid path full as an image layer (cache.DiffID); Content is its
	// content hash, what the digest is remembered by.
	DiffID(ctx context.Context, full string) (string, error)
	Content(full string) (string, error)
	// Dir is the directory of the valid store path full.
	Dir(full string) (string, error)
	// Hold makes name a gc root of the path full; Release removes it; Held lists the roots whose
	// names start with prefix.
	Hold(ctx context.Context, name, full string) error
	Release(name string) error
	Held(prefix string) ([]string, error)
}

// Snapshotter serves containerd's snapshots API. Its records are in <Dir>/meta.db; the layers
// containerd unpacks and the containers' uppers in <Dir>/snapshots/<id>.
type Snapshotter struct {
	snapshotsapi.UnimplementedSnapshotsServer
	Store Store
	Dir   string
	Log   *slog.Logger // nil: silent

	db       *bolt.DB
	instance string          // this snapshotter's part of its gc roots' names (rootPrefix)
	mu       sync.Mutex      // one change of the records at a time, with what it does on disk
	pending  map[string]bool // gc roots held for snapshots not yet recorded
}

// record is one snapshot.
type record struct {
	ID      uint64            `json:"id"`
	Kind    snapshotsapi.Kind `json:"kind"`
	Parent  string            `json:"parent,omitempty"`
	Path    string            `json:"path,omitempty"` // a store path's snapshot: its full name
	Root    string            `json:"root,omitempty"` // and the gc root that holds it
	Labels  map[string]string `json:"labels,omitempty"`
	Created time.Time         `json:"created"`
	Updated time.Time         `json:"updated"`
}

var (
	bucketSnapshots = []byte("snapshots") // key -> record
	bucketMeta      = []byte("meta")      // its sequence: the next id
	bucketDiffIDs   = []byte("diffids")   // a store path's full name and content hash -> its layer's diff ID
)

// Open opens (or makes) the snapshotter's records under dir.
func Open(st Store, dir string) (*Snapshotter, error) {
	if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o700); err != nil {
		return nil, err
	}
	db, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w (is another `shed snapshotter` running on it?)", filepath.Join(dir, "meta.db"), err)
	}
	var instance string
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSnapshots, bucketMeta, bucketDiffIDs} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get([]byte("instance")); v != nil {
			instance = string(v)
			return nil
		}
		b := make([]byte, 4)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		instance = hex.EncodeToString(b)
		return meta.Put([]byte("instance"), []byte(instance))
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &Snapshotter{Store: st, Dir: dir, db: db, instance: instance, pending: map[string]bool{}}, nil
}

func (sn *Snapshotter) log() *slog.Logger {
	if sn.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return sn.Log
}

// Close closes the records.
func (sn *Snapshotter) Close() error { return sn.db.Close() }

func (sn *Snapshotter) get(tx *bolt.Tx, key string) (*record, error) {
	b := tx.Bucket(bucketSnapshots).Get([]byte(key))
	if b == nil {
		return nil, status.Errorf(codes.NotFound, "snapshot %q does not exist", key)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, status.Errorf(codes.DataLoss, "snapshot %q: damaged record: %v", key, err)
	}
	return &r, nil
}

func put(tx *bolt.Tx, key string, r *record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketSnapshots).Put([]byte(key), b)
}

func nextID(tx *bolt.Tx) (uint64, error) {
	id, err := tx.Bucket(bucketMeta).NextSequence()
	return id, err
}

func (sn *Snapshotter) fsDir(id uint64) string {
	return filepath.Join(sn.Dir, "snapshots", strconv.FormatUint(id, 10), "fs")
}

func (sn *Snapshotter) workDir(id uint64) string {
	return filepath.Join(sn.Dir, "snapshots", strconv.FormatUint(id, 10), "work")
}

// chainID is the OCI chain ID of a layer with diffID over the chain parent ("" for the bottom).
func chainID(parent, diffID string) string {
	if parent == "" {
		return diffID
	}
	h := sha256.Sum256([]byte(parent + " " + diffID))
	return "sha256:" + hex.EncodeToString(h[:])
}

// Prepare makes an active snapshot over parent, or, for a layer that names a store path, the
// layer's committed snapshot itself (answered as "already exists").
func (sn *Snapshotter) Prepare(ctx context.Context, req *snapshotsapi.PrepareSnapshotRequest) (*snapshotsapi.PrepareSnapshotResponse, error) {
	if full := req.Labels[cache.SnapshotPathLabel]; full != "" && req.Labels[refLabel] != "" {
		err := sn.storeLayer(ctx, req.Parent, req.Labels[refLabel], full, req.Labels)
		if status.Code(err) == codes.AlreadyExists {
			sn.log().Info("layer from the store", "path", full, "snapshot", req.Labels[refLabel])
		} else {
			sn.log().Warn("layer refused", "path", full, "snapshot", req.Labels[refLabel], "err", err)
		}
		return nil, err
	}
	mounts, err := sn.create(req.Key, req.Parent, snapshotsapi.Kind_ACTIVE, req.Labels)
	if err != nil {
		return nil, err
	}
	return &snapshotsapi.PrepareSnapshotResponse{Mounts: mounts}, nil
}

// storeLayer commits the snapshot ref as the store path full over parent. Its error is
// AlreadyExists when it did (or the snapshot was there): containerd then skips the layer.
//
// The slow parts (a substitution, a first digest, the gc root, which waits for a running gc) run
// outside the lock; the root is held before the record commits, so no record is ever without one.
func (sn *Snapshotter) storeLayer(ctx context.Context, parent, ref, full string, labels map[string]string) error {
	var parentChain string
	err := sn.db.View(func(tx *bolt.Tx) error {
		if _, err := sn.get(tx, ref); err == nil {
			return status.Errorf(codes.AlreadyExists, "snapshot %q already exists", ref)
		}
		if parent == "" {
			return nil
		}
		p, err := sn.get(tx, parent)
		if err != nil {
			return err
		}
		if p.Kind != snapshotsapi.Kind_COMMITTED {
			return status.Errorf(codes.InvalidArgument, "parent %q is not committed", parent)
		}
		parentChain = chainOf(parent, p)
		return nil
	})
	if err != nil {
		return err
	}
	if err := sn.Store.Layer(ctx, full); err != nil {
		// containerd reports only the message: what to do rides in it.
		if h := hint.Of(err); h != "" {
			return status.Errorf(codes.FailedPrecondition, "layer %s: %v; to do: %s", full, err, h)
		}
		return status.Errorf(codes.FailedPrecondition, "layer %s: %v", full, err)
	}
	diffID, err := sn.diffID(ctx, full)
	if err != nil {
		return status.Errorf(codes.FailedPrecondition, "layer %s: %v", full, err)
	}
	if got := chainID(parentChain, diffID); got != ref {
		return status.Errorf(codes.FailedPrecondition,
			"layer %s: the image says its layer is the store path %s, whose layer digest here is %s; over the chain %q that makes %s, not %s: the image does not match the path it names",
			ref, full, diffID, parentChain, got, ref)
	}
	root, err := sn.newRoot()
	if err != nil {
		return err
	}
	defer sn.settled(root)
	if err := sn.Store.Hold(ctx, root, full); err != nil {
		return status.Errorf(codes.Internal, "hold %s: %v", full, err)
	}
	made := false
	sn.mu.Lock()
	err = sn.db.Update(func(tx *bolt.Tx) error {
		if _, err := sn.get(tx, ref); err == nil {
			return nil // made meanwhile, with a root of its own
		}
		if parent != "" {
			if _, err := sn.get(tx, parent); err != nil {
				return err // removed meanwhile
			}
		}
		id, err := nextID(tx)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		made = true
		return put(tx, ref, &record{ID: id, Kind: snapshotsapi.Kind_COMMITTED, Parent: parent, Path: full, Root: root, Labels: labels, Created: now, Updated: now})
	})
	sn.mu.Unlock()
	if err != nil || !made {
		if rerr := sn.Store.Release(root); rerr != nil && err == nil {
			err = rerr
		}
	}
	if err != nil {
		return err
	}
	// The transaction committed; containerd hears "already exists" and skips the layer.
	return status.Errorf(codes.AlreadyExists, "snapshot %q already exists", ref)
}

// chainOf is the chain ID of the committed snapshot key: the one containerd named it for (its
// snapshot.ref label, or the last part of the name containerd's metadata gave it, "NS/N/CHAIN").
func chainOf(key string, r *record) string {
	if v := r.Labels[refLabel]; v != "" {
		return v
	}
	return key[strings.LastIndex(key, "/")+1:]
}

// newRoot names a gc root for a snapshot about to be made: the instance's prefix and a random
// part, pending (Cleanup leaves it alone) until settled.
func (sn *Snapshotter) newRoot() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	name := sn.rootPrefix() + hex.EncodeToString(b)
	sn.mu.Lock()
	sn.pending[name] = true
	sn.mu.Unlock()
	return name, nil
}

func (sn *Snapshotter) settled(root string) {
	sn.mu.Lock()
	delete(sn.pending, root)
	sn.mu.Unlock()
}

// rootPrefix starts the names of this snapshotter's gc roots: "containerd-", its instance (made
// once with its records), "-". Two snapshotters on one store (two containerds on a node) keep
// apart whose roots are whose.
func (sn *Snapshotter) rootPrefix() string { return "containerd-" + sn.instance + "-" }

// diffID is the layer digest of the store path full, computed once per path and content (a path
// gc'd and substituted again from another cache may have other bytes under the same name).
func (sn *Snapshotter) diffID(ctx context.Context, full string) (string, error) {
	content, err := sn.Store.Content(full)
	if err != nil {
		return "", err
	}
	key := []byte(full + " " + content)
	var d string
	sn.db.View(func(tx *bolt.Tx) error {
		d = string(tx.Bucket(bucketDiffIDs).Get(key))
		return nil
	})
	if d != "" {
		return d, nil
	}
	if d, err = sn.Store.DiffID(ctx, full); err != nil {
		return "", err
	}
	return d, sn.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketDiffIDs).Put(key, []byte(d)) })
}

// View makes a read-only snapshot over parent.
func (sn *Snapshotter) View(ctx context.Context, req *snapshotsapi.ViewSnapshotRequest) (*snapshotsapi.ViewSnapshotResponse, error) {
	mounts, err := sn.create(req.Key, req.Parent, snapshotsapi.Kind_VIEW, req.Labels)
	if err != nil {
		return nil, err
	}
	return &snapshotsapi.ViewSnapshotResponse{Mounts: mounts}, nil
}

func (sn *Snapshotter) create(key, parent string, kind snapshotsapi.Kind, labels map[string]string) ([]*types.Mount, error) {
	if key == "" {
		return nil, status.Error(codes.InvalidArgument, "a snapshot needs a key")
	}
	sn.mu.Lock()
	defer sn.mu.Unlock()
	var r *record
	err := sn.db.Update(func(tx *bolt.Tx) error {
		if _, err := sn.get(tx, key); err == nil {
			return status.Errorf(codes.AlreadyExists, "snapshot %q already exists", key)
		}
		if parent != "" {
			p, err := sn.get(tx, parent)
			if err != nil {
				return err
			}
			if p.Kind != snapshotsapi.Kind_COMMITTED {
				return status.Errorf(codes.InvalidArgument, "parent %q is not committed", parent)
			}
		}
		id, err := nextID(tx)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		r = &record{ID: id, Kind: kind, Parent: parent, Labels: labels, Created: now, Updated: now}
		if kind == snapshotsapi.Kind_ACTIVE {
			if err := os.MkdirAll(sn.fsDir(id), 0o755); err != nil {
				return err
			}
			if err := os.MkdirAll(sn.workDir(id), 0o711); err != nil {
				return err
			}
		}
		return put(tx, key, r)
	})
	if err != nil {
		return nil, err
	}
	var mounts []*types.Mount
	err = sn.db.View(func(tx *bolt.Tx) error {
		var err error
		mounts, err = sn.mounts(tx, r)
		return err
	})
	return mounts, err
}

// lowers are the directories of r's parent chain, nearest first (overlay's lowerdir order).
func (sn *Snapshotter) lowers(tx *bolt.Tx, r *record) ([]string, error) {
	var out []string
	for parent := r.Parent; parent != ""; {
		p, err := sn.get(tx, parent)
		if err != nil {
			return nil, status.Errorf(codes.DataLoss, "the chain of a snapshot: %v", err)
		}
		if p.Path != "" {
			dir, err := sn.Store.Dir(p.Path)
			if err != nil {
				return nil, status.Errorf(codes.FailedPrecondition, "layer %s: %v", p.Path, err)
			}
			out = append(out, dir)
		} else {
			out = append(out, sn.fsDir(p.ID))
		}
		parent = p.Parent
	}
	return out, nil
}

func (sn *Snapshotter) mounts(tx *bolt.Tx, r *record) ([]*types.Mount, error) {
	lowers, err := sn.lowers(tx, r)
	if err != nil {
		return nil, err
	}
	switch {
	case r.Kind == snapshotsapi.Kind_ACTIVE && len(lowers) == 0:
		return []*types.Mount{{Type: "bind", Source: sn.fsDir(r.ID), Options: []string{"rw", "rbind"}}}, nil
	case r.Kind == snapshotsapi.Kind_ACTIVE:
		return []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{
			"workdir=" + sn.workDir(r.ID), "upperdir=" + sn.fsDir(r.ID), "lowerdir=" + strings.Join(lowers, ":")}}}, nil
	case r.Kind == snapshotsapi.Kind_VIEW && len(lowers) == 1:
		return []*types.Mount{{Type: "bind", Source: lowers[0], Options: []string{"ro", "rbind"}}}, nil
	case r.Kind == snapshotsapi.Kind_VIEW && len(lowers) > 1:
		return []*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=" + strings.Join(lowers, ":")}}}, nil
	case r.Kind == snapshotsapi.Kind_VIEW:
		// A view of nothing: an empty directory, read-only.
		dir := sn.fsDir(r.ID)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		return []*types.Mount{{Type: "bind", Source: dir, Options: []string{"ro", "rbind"}}}, nil
	}
	return nil, status.Errorf(codes.FailedPrecondition, "a committed snapshot has no mounts; prepare or view over it")
}

// Mounts returns an active or view snapshot's mounts again.
func (sn *Snapshotter) Mounts(ctx context.Context, req *snapshotsapi.MountsRequest) (*snapshotsapi.MountsResponse, error) {
	var mounts []*types.Mount
	err := sn.db.View(func(tx *bolt.Tx) error {
		r, err := sn.get(tx, req.Key)
		if err != nil {
			return err
		}
		mounts, err = sn.mounts(tx, r)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &snapshotsapi.MountsResponse{Mounts: mounts}, nil
}

// Commit turns the active snapshot key into the committed snapshot name: an unpacked layer.
func (sn *Snapshotter) Commit(ctx context.Context, req *snapshotsapi.CommitSnapshotRequest) (*emptypb.Empty, error) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	var id uint64
	err := sn.db.Update(func(tx *bolt.Tx) error {
		r, err := sn.get(tx, req.Key)
		if err != nil {
			return err
		}
		if r.Kind != snapshotsapi.Kind_ACTIVE {
			return status.Errorf(codes.FailedPrecondition, "snapshot %q is not active", req.Key)
		}
		if _, err := sn.get(tx, req.Name); err == nil {
			return status.Errorf(codes.AlreadyExists, "snapshot %q already exists", req.Name)
		}
		id = r.ID
		r.Kind, r.Updated = snapshotsapi.Kind_COMMITTED, time.Now().UTC()
		if len(req.Labels) > 0 {
			r.Labels = req.Labels
		}
		if err := tx.Bucket(bucketSnapshots).Delete([]byte(req.Key)); err != nil {
			return err
		}
		return put(tx, req.Name, r)
	})
	if err != nil {
		return nil, err
	}
	// Once committed: the upper's work directory is overlay's scratch, not part of the layer.
	if err := os.RemoveAll(sn.workDir(id)); err != nil {
		return nil, status.Errorf(codes.Internal, "commit %q: %v", req.Name, err)
	}
	return &emptypb.Empty{}, nil
}

// Remove removes a snapshot no other is over: its directory, or its store path's gc root.
func (sn *Snapshotter) Remove(ctx context.Context, req *snapshotsapi.RemoveSnapshotRequest) (*emptypb.Empty, error) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	var gone *record
	err := sn.db.Update(func(tx *bolt.Tx) error {
		r, err := sn.get(tx, req.Key)
		if err != nil {
			return err
		}
		c := tx.Bucket(bucketSnapshots).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			var o record
			if json.Unmarshal(v, &o) == nil && o.Parent == req.Key {
				return status.Errorf(codes.FailedPrecondition, "snapshot %q has a child, %q: remove it first", req.Key, k)
			}
		}
		gone = r
		return tx.Bucket(bucketSnapshots).Delete([]byte(req.Key))
	})
	if err != nil {
		return nil, err
	}
	// After the record: a crash between leaves a directory Cleanup removes, or a root the next
	// Cleanup releases, never a record whose bytes are gone.
	if gone.Root != "" {
		if err := sn.Store.Release(gone.Root); err != nil {
			return nil, status.Errorf(codes.Internal, "release %s: %v", gone.Path, err)
		}
	} else if err := os.RemoveAll(filepath.Dir(sn.fsDir(gone.ID))); err != nil {
		return nil, status.Errorf(codes.Internal, "remove snapshot %q: %v", req.Key, err)
	}
	return &emptypb.Empty{}, nil
}

func info(key string, r *record) *snapshotsapi.Info {
	return &snapshotsapi.Info{Name: key, Parent: r.Parent, Kind: r.Kind, Labels: r.Labels,
		CreatedAt: timestamppb.New(r.Created), UpdatedAt: timestamppb.New(r.Updated)}
}

// Stat returns a snapshot's info.
func (sn *Snapshotter) Stat(ctx context.Context, req *snapshotsapi.StatSnapshotRequest) (*snapshotsapi.StatSnapshotResponse, error) {
	var out *snapshotsapi.Info
	err := sn.db.View(func(tx *bolt.Tx) error {
		r, err := sn.get(tx, req.Key)
		if err != nil {
			return err
		}
		out = info(req.Key, r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &snapshotsapi.StatSnapshotResponse{Info: out}, nil
}

// Update changes a snapshot's labels (the only field containerd updates).
func (sn *Snapshotter) Update(ctx context.Context, req *snapshotsapi.UpdateSnapshotRequest) (*snapshotsapi.UpdateSnapshotResponse, error) {
	if req.Info == nil {
		return nil, status.Error(codes.InvalidArgument, "no info")
	}
	sn.mu.Lock()
	defer sn.mu.Unlock()
	var out *snapshotsapi.Info
	err := sn.db.Update(func(tx *bolt.Tx) error {
		r, err := sn.get(tx, req.Info.Name)
		if err != nil {
			return err
		}
		paths := []string{"labels"}
		if req.UpdateMask != nil && len(req.UpdateMask.Paths) > 0 {
			paths = req.UpdateMask.Paths
		}
		for _, p := range paths {
			switch {
			case p == "labels":
				r.Labels = req.Info.Labels
			case strings.HasPrefix(p, "labels."):
				k := strings.TrimPrefix(p, "labels.")
				if v, ok := req.Info.Labels[k]; ok {
					if r.Labels == nil {
						r.Labels = map[string]string{}
					}
					r.Labels[k] = v
				} else {
					delete(r.Labels, k)
				}
			default:
				return status.Errorf(codes.InvalidArgument, "cannot update field %q of a snapshot", p)
			}
		}
		r.Updated = time.Now().UTC()
		out = info(req.Info.Name, r)
		return put(tx, req.Info.Name, r)
	})
	if err != nil {
		return nil, err
	}
	return &snapshotsapi.UpdateSnapshotResponse{Info: out}, nil
}

// List streams every snapshot (containerd filters what it needs itself).
func (sn *Snapshotter) List(req *snapshotsapi.ListSnapshotsRequest, stream snapshotsapi.Snapshots_ListServer) error {
	var infos []*snapshotsapi.Info
	err := sn.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).ForEach(func(k, v []byte) error {
			var r record
			if err := json.Unmarshal(v, &r); err != nil {
				return status.Errorf(codes.DataLoss, "snapshot %q: damaged record: %v", k, err)
			}
			infos = append(infos, info(string(k), &r))
			return nil
		})
	})
	if err != nil {
		return err
	}
	for len(infos) > 0 {
		n := min(len(infos), 100)
		if err := stream.Send(&snapshotsapi.ListSnapshotsResponse{Info: infos[:n]}); err != nil {
			return err
		}
		infos = infos[n:]
	}
	return nil
}

// Usage is the bytes and inodes a snapshot's own directory holds (a store path's: none of the
// snapshotter's; `shed store info` shows the path's).
func (sn *Snapshotter) Usage(ctx context.Context, req *snapshotsapi.UsageRequest) (*snapshotsapi.UsageResponse, error) {
	var r *record
	err := sn.db.View(func(tx *bolt.Tx) error {
		var err error
		r, err = sn.get(tx, req.Key)
		return err
	})
	if err != nil {
		return nil, err
	}
	var size, inodes int64
	if r.Path == "" {
		filepath.WalkDir(sn.fsDir(r.ID), func(_ string, d os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			inodes++
			if fi, err := d.Info(); err == nil && d.Type().IsRegular() {
				size += fi.Size()
			}
			return nil
		})
	}
	return &snapshotsapi.UsageResponse{Size: size, Inodes: inodes}, nil
}

// Cleanup removes the directories and gc roots of snapshots that have no record (what a crash
// between a record's removal and its directory's or root's left).
func (sn *Snapshotter) Cleanup(ctx context.Context, req *snapshotsapi.CleanupRequest) (*emptypb.Empty, error) {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	ids, roots := map[string]bool{}, map[string]bool{}
	err := sn.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).ForEach(func(k, v []byte) error {
			var r record
			if err := json.Unmarshal(v, &r); err != nil {
				// A record it cannot read might hold a root: nothing is released.
				return status.Errorf(codes.DataLoss, "snapshot %q: damaged record: %v", k, err)
			}
			ids[strconv.FormatUint(r.ID, 10)] = true
			roots[r.Root] = true
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(filepath.Join(sn.Dir, "snapshots"))
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if !ids[e.Name()] {
			if err := os.RemoveAll(filepath.Join(sn.Dir, "snapshots", e.Name())); err != nil {
				return nil, err
			}
		}
	}
	held, err := sn.Store.Held(sn.rootPrefix())
	if err != nil {
		return nil, err
	}
	for _, name := range held {
		if !roots[name] && !sn.pending[name] {
			if err := sn.Store.Release(name); err != nil {
				return nil, err
			}
		}
	}
	return &emptypb.Empty{}, nil
}
