package derivation

import (
	"context"
	"fmt"

	"toolshed.dev/shed/store"
)

// Write stores d's .drv file (a no-op when it is there already) and returns its path.
func Write(ctx context.Context, s *store.Store, d *Derivation) (store.Path, error) {
	info, err := s.AddText(ctx, d.DrvName(), d.Encode(), d.References())
	if err != nil {
		return store.Path{}, fmt.Errorf("write %s: %w", d.DrvName(), err)
	}
	return info.Path, nil
}

// Read loads and checks the .drv file at p.
func Read(s *store.Store, p store.Path) (*Derivation, error) {
	b, err := readFile(s.Location(p))
	if err != nil {
		return nil, err
	}
	d, err := Decode(b, s.StoreDir())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return d, nil
}
