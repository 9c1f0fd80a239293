package trust

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"time"

	"toolshed.dev/shed/store"
)

// ProvenanceType names the provenance format, in the payload and as the envelope's payload type.
const ProvenanceType = "application/vnd.toolshed.provenance.v1+json"

// Provenance says how a store path was made. Its signature covers all of it, and it names the path,
// its content hash, its size, its references and build inputs, its deriver and its content address, so it cannot be
// moved onto other bytes or another path, nor register them with a record they were not signed with.
type Provenance struct {
	Type        string     `json:"type"`
	Path        string     `json:"path"` // the full store path: the store directory is part of the identity
	ContentHash store.Hash `json:"content_hash"`
	Size        int64      `json:"size"`
	References  []string   `json:"references"`
	BuildInputs []string   `json:"build_inputs,omitempty"`
	Deriver     string     `json:"deriver,omitempty"`
	CA          string     `json:"ca,omitempty"`
	// Derivation is the text of the .drv that produced the path.
	Derivation string    `json:"derivation,omitempty"`
	Inputs     []Input   `json:"inputs,omitempty"`
	Fetches    []Fetch   `json:"fetches,omitempty"`
	Builder    Builder   `json:"builder"`
	Time       time.Time `json:"time"`
}

// Input is an input path of a build and the content it had.
type Input struct {
	Path        string     `json:"path"`
	ContentHash store.Hash `json:"content_hash"`
}

// Fetch is a file a build downloaded: every byte of it hashed to SHA256.
type Fetch struct {
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Builder says who built the path.
type Builder struct {
	Shed string `json:"shed"` // shed's version
	Key  string `json:"key"`  // the signing key's public form
}

// Facts are what the builder tells the signer about a path it registers (store.AddOptions.Facts).
type Facts struct {
	Derivation string
	Inputs     []Input
	Fetches    []Fetch
}

// envelope is a DSSE envelope (github.com/secure-systems-lab/dsse), as in-toto attestations use: the
// signature covers the payload type and the exact payload bytes, so nothing is re-encoded to check it.
type envelope struct {
	PayloadType string      `json:"payloadType"`
	Payload     string      `json:"payload"` // base64
	Signatures  []signature `json:"signatures"`
}

type signature struct {
	KeyID string `json:"keyid"`
	Sig   string `json:"sig"` // base64
}

// pae is DSSE's pre-authentication encoding of what a signature covers.
func pae(payloadType string, payload []byte) []byte {
	b := []byte("DSSEv1 ")
	b = strconv.AppendInt(b, int64(len(payloadType)), 10)
	b = append(b, ' ')
	b = append(b, payloadType...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(payload)), 10)
	b = append(b, ' ')
	return append(b, payload...)
}

// Sign returns p in an envelope signed with k.
func Sign(k *SecretKey, p *Provenance) ([]byte, error) {
	payload, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	env := envelope{
		PayloadType: ProvenanceType,
		Payload:     base64.StdEncoding.EncodeToString(payload),
		Signatures: []signature{{
			KeyID: k.Public().ID(),
			Sig:   base64.StdEncoding.EncodeToString(ed25519.Sign(k.key, pae(ProvenanceType, payload))),
		}},
	}
	b, err := json.MarshalIndent(env, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// New returns the provenance of a path being registered.
func New(storeDir string, info *store.PathInfo, f *Facts, shed string, key PublicKey, now time.Time) *Provenance {
	p := &Provenance{
		Type:        ProvenanceType,
		Path:        path.Join(storeDir, info.Path.String()),
		ContentHash: info.ContentHash,
		Size:        info.Size,
		References:  make([]string, 0, len(info.References)),
		CA:          info.CA,
		Builder:     Builder{Shed: shed, Key: key.ID()},
		Time:        now.UTC().Truncate(time.Second),
	}
	for _, r := range info.References {
		p.References = append(p.References, path.Join(storeDir, r.String()))
	}
	for _, r := range info.BuildInputs {
		p.BuildInputs = append(p.BuildInputs, path.Join(storeDir, r.String()))
	}
	if !info.Deriver.IsZero() {
		p.Deriver = path.Join(storeDir, info.Deriver.String())
	}
	if f != nil {
		p.Derivation, p.Inputs, p.Fetches = f.Derivation, f.Inputs, f.Fetches
	}
	return p
}

// Errors of Policy.Check, each saying which check failed.
var (
	ErrUnsigned     = errors.New("no signed provenance")
	ErrUntrusted    = errors.New("not signed by a trusted key")
	ErrBadSignature = errors.New("signature does not verify")
	ErrMismatch     = errors.New("provenance does not describe these bytes")
	ErrReplay       = errors.New("provenance older than one already accepted for this path")
)

// Policy is the set of keys whose signatures a store accepts.
type Policy struct {
	Trusted []PublicKey
}

// Check verifies that envelope is a provenance of exactly info (path in storeDir, content hash,
// size, references, deriver, content address) signed by a trusted key, and returns it. It never
// trusts a hash by itself.
func (pol *Policy) Check(storeDir string, info *store.PathInfo, data []byte) (*Provenance, error) {
	if len(data) == 0 {
		return nil, ErrUnsigned
	}
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("%w: unreadable envelope: %v", ErrUnsigned, err)
	}
	if env.PayloadType != ProvenanceType {
		return nil, fmt.Errorf("%w: payload type %q", ErrUnsigned, env.PayloadType)
	}
	if len(env.Signatures) == 0 {
		return nil, ErrUnsigned
	}
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: payload: %v", ErrUnsigned, err)
	}
	msg := pae(env.PayloadType, payload)
	var signers []string
	verified := false
	for _, s := range env.Signatures {
		signers = append(signers, s.KeyID)
		i := slices.IndexFunc(pol.Trusted, func(k PublicKey) bool { return k.ID() == s.KeyID })
		if i < 0 {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(s.Sig)
		if err != nil || !ed25519.Verify(pol.Trusted[i].Key, msg, sig) {
			return nil, fmt.Errorf("%w: key %s", ErrBadSignature, pol.Trusted[i].Name)
		}
		verified = true
	}
	if !verified {
		return nil, fmt.Errorf("%w: signed by %s", ErrUntrusted, keyNames(signers))
	}
	var p Provenance
	if err := json.Unmarshal(payload, &p); err != nil {
		return nil, fmt.Errorf("%w: payload: %v", ErrMismatch, err)
	}
	want := New(storeDir, info, nil, "", PublicKey{}, time.Time{})
	switch {
	case p.Type != ProvenanceType:
		return nil, fmt.Errorf("%w: type %q", ErrMismatch, p.Type)
	case p.Path != want.Path:
		return nil, fmt.Errorf("%w: it is the provenance of %s", ErrMismatch, p.Path)
	case p.ContentHash != want.ContentHash:
		return nil, fmt.Errorf("%w: signed content hash %s, the bytes hash to %s", ErrMismatch, p.ContentHash, want.ContentHash)
	case p.Size != want.Size:
		return nil, fmt.Errorf("%w: signed size %d, the bytes are %d", ErrMismatch, p.Size, want.Size)
	case !slices.Equal(p.References, want.References):
		return nil, fmt.Errorf("%w: signed references %q, recorded %q", ErrMismatch, p.References, want.References)
	// A record may name fewer build inputs than were signed (an older shed pulled the path and kept
	// none): that only lets gc free more. It may not name one that was not signed.
	case !subset(want.BuildInputs, p.BuildInputs):
		return nil, fmt.Errorf("%w: signed build inputs %q, recorded %q", ErrMismatch, p.BuildInputs, want.BuildInputs)
	// What a path registers beside its bytes is signed too: a deriver says which .drv explains it (and
	// gc keeps), a content address how its name was made. A provenance without them (none was signed)
	// fits only a path that registers none.
	case p.Deriver != want.Deriver:
		return nil, fmt.Errorf("%w: signed deriver %q, recorded %q", ErrMismatch, p.Deriver, want.Deriver)
	case p.CA != want.CA:
		return nil, fmt.Errorf("%w: signed content address %q, recorded %q", ErrMismatch, p.CA, want.CA)
	}
	return &p, nil
}

// subset reports whether every element of a is in b.
func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// keyNames shortens key ids (NAME:BASE64) to their names for messages.
func keyNames(ids []string) string {
	var names []string
	for _, id := range ids {
		if k, err := ParsePublicKey(id); err == nil {
			names = append(names, k.Name)
		} else {
			names = append(names, strconv.Quote(id))
		}
	}
	if len(names) == 0 {
		return "nobody"
	}
	return fmt.Sprint(names)
}
