package app

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"toolshed.dev/shed/builder"
	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/store"
)

// NodeStore is the store as containerd's snapshotter on a node uses it (package snapshotter): store
// paths an image names, made valid from the store's substituters as realize would (trusted
// signatures only), their layer digests, and gc roots for the snapshots that use them.
type NodeStore struct {
	st  *store.Store
	sub builder.Substituter // nil: no substituters configured
}

// OpenNodeStore opens the store for a snapshotter. Close it when done.
func (s *Service) OpenNodeStore() (*NodeStore, error) {
	st, err := s.openStore()
	if err != nil {
		return nil, err
	}
	sub, err := s.substituter(&Call{}, st, nil)
	if err != nil {
		st.Close()
		return nil, err
	}
	return &NodeStore{st: st, sub: sub}, nil
}

// Close closes the store.
func (n *NodeStore) Close() error { return n.st.Close() }

// path parses a path's full name as an image names it: under this store's store_dir.
func (n *NodeStore) path(full string) (store.Path, error) {
	base, ok := strings.CutPrefix(full, n.st.StoreDir()+"/")
	if !ok {
		return store.Path{}, fmt.Errorf("%s is not under this store's store_dir, %s: the image was made by a store with another store_dir", full, n.st.StoreDir())
	}
	return store.ParsePath(base)
}

// Layer makes the path full valid: present, or pulled from a substituter that has it signed by a
// trusted key.
func (n *NodeStore) Layer(ctx context.Context, full string) error {
	p, err := n.path(full)
	if err != nil {
		return err
	}
	if n.st.IsValid(p) {
		return nil
	}
	if n.sub == nil {
		return hint.Wrap(fmt.Errorf("%s is not in this node's store, which has no substituters", full), "name the registry CI pushes to in `substituters` of the store's config.toml")
	}
	ok, err := n.sub.Pull(ctx, p, nil, nil)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s is not in this node's store or in its substituters", full)
	}
	return nil
}

// Dir is the directory of the valid path full.
func (n *NodeStore) Dir(full string) (string, error) {
	p, err := n.path(full)
	if err != nil {
		return "", err
	}
	if !n.st.IsValid(p) {
		return "", fmt.Errorf("%s: %w", full, store.ErrNotExist)
	}
	return n.st.Location(p), nil
}

// DiffID is the digest of the valid path full as an image layer.
func (n *NodeStore) DiffID(ctx context.Context, full string) (string, error) {
	p, err := n.path(full)
	if err != nil {
		return "", err
	}
	d, err := cache.DiffID(ctx, n.st, p)
	return d.String(), err
}

// Content is the content hash of the valid path full.
func (n *NodeStore) Content(full string) (string, error) {
	p, err := n.path(full)
	if err != nil {
		return "", err
	}
	info, err := n.st.Info(p)
	if err != nil {
		return "", err
	}
	return info.ContentHash.String(), nil
}

// Hold makes name a gc root of the path full.
func (n *NodeStore) Hold(ctx context.Context, name, full string) error {
	p, err := n.path(full)
	if err != nil {
		return err
	}
	return n.st.AddRoot(ctx, name, p)
}

// Release removes the gc root name.
func (n *NodeStore) Release(name string) error {
	if err := n.st.RemoveRoot(name); err != nil && !errors.Is(err, store.ErrRootNotExist) {
		return err
	}
	return nil
}

// Held lists the gc roots whose names start with prefix.
func (n *NodeStore) Held(prefix string) ([]string, error) {
	roots, err := n.st.Roots()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range roots {
		if strings.HasPrefix(r.Name, prefix) {
			out = append(out, r.Name)
		}
	}
	return out, nil
}
