package trust

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"toolshed.dev/shed/internal/atomicfile"
	"toolshed.dev/shed/store"
)

// Store is one store's trust: the key it signs with, the keys it accepts, and what it has accepted.
type Store struct {
	Keys   *Keys
	Key    *SecretKey
	Policy *Policy
	s      *store.Store
	shed   string
	now    func() time.Time
}

// Open loads the trust of s: its signing key (ErrNoKey if `shed init` never made one), its own
// current and retired public keys, and the config's trusted_public_keys. shed is shed's version, as
// provenance names the builder.
func Open(s *store.Store, shed string) (*Store, error) {
	ks := OpenKeys(s.Root())
	key, err := ks.Secret()
	if err != nil {
		return nil, err
	}
	retired, err := ks.Retired()
	if err != nil {
		return nil, err
	}
	pol := &Policy{Trusted: append([]PublicKey{key.Public()}, retired...)}
	for i, k := range s.Config().TrustedPublicKeys {
		pk, err := ParsePublicKey(k)
		if err != nil {
			return nil, fmt.Errorf("config.toml: trusted_public_keys[%d]: %w", i, err)
		}
		pol.Trusted = append(pol.Trusted, pk)
	}
	return &Store{Keys: ks, Key: key, Policy: pol, s: s, shed: shed, now: time.Now}, nil
}

// Attest is the store's attestor (store.SetAttestor): it signs the provenance of every path the store
// registers, with the builder's facts, and records the provenance's time as seen.
func (t *Store) Attest(info *store.PathInfo, facts any) ([]byte, error) {
	f, _ := facts.(*Facts)
	p := New(t.s.StoreDir(), info, f, t.shed, t.Key.Public(), t.now())
	env, err := Sign(t.Key, p)
	if err != nil {
		return nil, err
	}
	return env, t.recordSeen(info.Path, p.Time)
}

// Accept checks a provenance that arrived with a path from elsewhere, before anything of the path is
// registered: Policy.Check, then that it is not older than one already accepted for the same path (a
// replay). It records nothing: the caller calls Accepted once the path's tree has been verified against
// the provenance and the path registered with it, so an artifact refused later (bytes that do not
// hash to what was signed) leaves the replay state as it was.
func (t *Store) Accept(info *store.PathInfo, data []byte) error {
	p, err := t.Policy.Check(t.s.StoreDir(), info, data)
	if err != nil {
		return err
	}
	seen, ok, err := t.seen(info.Path)
	if err != nil {
		return err
	}
	if ok && p.Time.Before(seen) {
		return fmt.Errorf("%w: signed %s, one of %s was accepted before", ErrReplay, p.Time.Format(time.RFC3339), seen.Format(time.RFC3339))
	}
	return nil
}

// Accepted records that data, the provenance of the registered path info, was accepted: a later
// provenance of the path may not be older. It checks data against info again, so nothing that does
// not verify is recorded. Call it only after the path was registered with data.
func (t *Store) Accepted(info *store.PathInfo, data []byte) error {
	p, err := t.Policy.Check(t.s.StoreDir(), info, data)
	if err != nil {
		return err
	}
	return t.recordSeen(info.Path, p.Time)
}

// Verify is the check of `shed store verify`: the path's provenance verifies under the policy.
func (t *Store) Verify(info *store.PathInfo, data []byte) error {
	_, err := t.Policy.Check(t.s.StoreDir(), info, data)
	return err
}

// seenFile keeps, per path, the time of the newest provenance accepted for it. It outlives the path
// (gc does not touch it), so a registry cannot roll a path back to an older provenance later.
func (t *Store) seenFile(p store.Path) string {
	return filepath.Join(t.Keys.dir, "seen", p.HashPart())
}

// seen returns the time recorded for p, if any. A record that cannot be read is an error, not "never
// seen": that would let any older provenance through.
func (t *Store) seen(p store.Path) (time.Time, bool, error) {
	b, err := os.ReadFile(t.seenFile(p))
	if errors.Is(err, os.ErrNotExist) {
		return time.Time{}, false, nil
	} else if err != nil {
		return time.Time{}, false, fmt.Errorf("read the replay state of %s: %w", p, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read the replay state of %s: %s: %w", p, t.seenFile(p), err)
	}
	return time.Unix(n, 0), true, nil
}

// recordSeen raises p's replay bound to when (it never lowers it).
func (t *Store) recordSeen(p store.Path, when time.Time) error {
	prev, ok, err := t.seen(p)
	if err != nil {
		return err
	}
	if ok && !when.After(prev) {
		return nil
	}
	f := t.seenFile(p)
	if err := atomicfile.MkdirAll(filepath.Dir(f), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(f, []byte(strconv.FormatInt(when.Unix(), 10)+"\n"), 0o600)
}

// Resign signs the provenance of a valid path again with the current key (after a rotation, or for a
// path registered before the store signed its paths), keeping what the old provenance said if it
// verifies.
func (t *Store) Resign(ctx context.Context, p store.Path) error {
	return t.s.SetProvenance(ctx, p, func(info *store.PathInfo) ([]byte, error) {
		var facts *Facts
		if old, err := t.s.Provenance(p); err == nil {
			if prev, err := t.Policy.Check(t.s.StoreDir(), info, old); err == nil {
				facts = &Facts{Derivation: prev.Derivation, Inputs: prev.Inputs, Fetches: prev.Fetches}
			}
		} else if !errors.Is(err, store.ErrNoProvenance) {
			return nil, err
		}
		return t.Attest(info, facts)
	})
}
