package app

import (
	"context"
	"fmt"
	"os/user"
	"time"

	"toolshed.dev/shed/apikey"
)

func init() {
	op("agent.key_create", (*Service).KeyCreate)
	op("agent.key_ls", (*Service).KeyList)
	op("agent.key_rm", (*Service).KeyRemove)
}

// KeyCreateRequest asks for a new API key for a local user.
type KeyCreateRequest struct {
	User string `json:"user"` // the local user the key acts as (its roles and limits)
}

// KeyCreateResult is the key made: shown this once, stored only as its hash.
type KeyCreateResult struct {
	Key     string    `json:"key"`     // the secret (E2B_API_KEY); shed keeps only its SHA-256
	ID      string    `json:"id"`      // its public name, for `shed agent key rm`
	User    string    `json:"user"`    // the user it acts as
	Created time.Time `json:"created"` // when
}

// KeyCreate makes an API key that acts as a local user.
func (s *Service) KeyCreate(ctx context.Context, c *Call, req *KeyCreateRequest) (*KeyCreateResult, error) {
	if _, err := user.Lookup(req.User); err != nil {
		return nil, usage("a local user's name (getent passwd NAME); make one for the harness with useradd", "no local user %q", req.User)
	}
	secret, k, err := apikey.Open(s.Root).Create(req.User)
	if err != nil {
		return nil, err
	}
	return &KeyCreateResult{Key: secret, ID: k.ID, User: k.User, Created: k.Created}, nil
}

// KeyInfo is what may be shown of a key: never the key.
type KeyInfo struct {
	ID      string    `json:"id"`      // its public name
	User    string    `json:"user"`    // the user it acts as
	Created time.Time `json:"created"` // when it was made
}

// KeyListResult lists the API keys.
type KeyListResult struct {
	Keys []KeyInfo `json:"keys"` // oldest first
}

// KeyList lists the API keys, by id and user.
func (s *Service) KeyList(ctx context.Context, c *Call, req *Empty) (*KeyListResult, error) {
	keys, err := apikey.Open(s.Root).List()
	if err != nil {
		return nil, err
	}
	res := &KeyListResult{Keys: []KeyInfo{}}
	for _, k := range keys {
		res.Keys = append(res.Keys, KeyInfo{ID: k.ID, User: k.User, Created: k.Created})
	}
	return res, nil
}

// KeyRemoveRequest names the keys to remove.
type KeyRemoveRequest struct {
	ID string `json:"id"` // a key's id, or user:NAME for every key of a user
}

// KeyRemove removes API keys: a harness using one is refused from its next request on.
func (s *Service) KeyRemove(ctx context.Context, c *Call, req *KeyRemoveRequest) (*KeyListResult, error) {
	gone, err := apikey.Open(s.Root).Remove(req.ID)
	if err != nil {
		return nil, fail(CodeNotFound, err, "`shed agent key ls` lists the keys")
	}
	res := &KeyListResult{Keys: []KeyInfo{}}
	for _, k := range gone {
		res.Keys = append(res.Keys, KeyInfo{ID: k.ID, User: k.User, Created: k.Created})
	}
	return res, nil
}

// keyDetail is what the audit log says of a key operation: ids and users, never a key.
func keyDetail(res any) string {
	switch r := res.(type) {
	case *KeyCreateResult:
		if r != nil {
			return fmt.Sprintf("key %s for %s", r.ID, r.User)
		}
	case *KeyListResult:
		if r != nil {
			d := ""
			for _, k := range r.Keys {
				d += fmt.Sprintf("key %s for %s; ", k.ID, k.User)
			}
			return d
		}
	}
	return ""
}
