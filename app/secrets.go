package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"toolshed.dev/shed/bench"
	"toolshed.dev/shed/proxy"
	"toolshed.dev/shed/secret"
)

func init() {
	op("secret.add", (*Service).SecretAdd)
	op("secret.ls", (*Service).SecretList)
	op("secret.rm", (*Service).SecretRemove)
	op("secret.update", (*Service).SecretUpdate)
}

// SecretAddRequest stores a credential in the supervisor (docs/secrets.md). The value travels in
// this request only; no result, log or audit entry carries it.
type SecretAddRequest struct {
	Name  string `json:"name"`
	Value []byte `json:"value"`
	// Hosts are the destinations it is bound to (HOST[:PORT], 443 by default) and Place where in a
	// request it goes: "header:NAME: TEMPLATE" ("header:Authorization: Bearer {}"), "basic",
	// "query:PARAM". None: it goes only where a launch's own transforms put it (the E2B API's).
	Hosts []string `json:"hosts,omitempty"`
	Place string   `json:"place,omitempty"`
	// Env is the variable a Bench finds its placeholder in (default: the name in capitals).
	Env string `json:"env,omitempty"`
	// Body lets the placeholder be replaced in request bodies too (headers and URL only otherwise).
	Body bool `json:"body,omitempty"`
	// Owner is the user who may name it: an operator's choice ("" is operators only); a user's own
	// secrets are theirs.
	Owner    string            `json:"owner,omitempty"`
	Replace  bool              `json:"replace,omitempty"` // replace an existing secret of that name (a new version)
	Metadata map[string]string `json:"metadata,omitempty"`
}

// SecretResult is a secret's metadata: never its value.
type SecretResult struct {
	Secret secret.Secret `json:"secret"`
}

// SecretListResult lists secrets' metadata.
type SecretListResult struct {
	Secrets []secret.Secret `json:"secrets"`
}

// SecretRequest names a secret (by name or E2B id).
type SecretRequest struct {
	Name string `json:"name"`
}

func (s *Service) secrets() *secret.Store { return secret.Open(s.Root) }

// SecretAdd stores a secret. An operator names its owner; a user's secret is their own.
func (s *Service) SecretAdd(ctx context.Context, c *Call, req *SecretAddRequest) (*SecretResult, error) {
	sec := secret.Secret{Name: strings.ToLower(req.Name), Env: req.Env, Body: req.Body, Owner: req.Owner, Metadata: req.Metadata}
	if c.Caller.Role != Operator {
		sec.Owner = c.Caller.User
	}
	if err := secret.CheckName(sec.Name); err != nil {
		return nil, usage("name it as a Workshop is named: shed secret add github-token", "%v", err)
	}
	for _, h := range req.Hosts {
		host, err := secret.ParseHost(h)
		if err != nil {
			return nil, usage("--host api.example.com, or --host api.example.com:8443", "%v", err)
		}
		sec.Hosts = append(sec.Hosts, host)
	}
	if req.Place != "" {
		p, err := secret.ParsePlace(req.Place)
		if err != nil {
			return nil, usage(`--header "Authorization: Bearer {}", --basic, or --query PARAM`, "%v", err)
		}
		sec.Place = p
	}
	if len(sec.Hosts) > 0 && sec.Place == (secret.Place{}) {
		return nil, usage(`say where it goes: --header "Authorization: Bearer {}", --basic, or --query PARAM`, "secret %s: bound to hosts but to no place in a request", sec.Name)
	}
	if len(sec.Hosts) == 0 && sec.Place != (secret.Place{}) {
		return nil, usage("--host names where it may go", "secret %s: a place but no host", sec.Name)
	}
	st := s.secrets()
	old, oerr := st.Get(sec.Name)
	if oerr == nil && c.Caller.Role == Operator && req.Owner == "" {
		sec.Owner = old.Owner // a replace keeps the owner unless the operator names another
	}
	if old, err := old, oerr; err == nil && !mayUseSecret(c.Caller, &old) {
		// Names are one namespace, as E2B's are a project's: taken, not forbidden.
		return nil, fail(CodeConflict, fmt.Errorf("secret name %s is taken", sec.Name), "name yours otherwise")
	}
	out, err := st.Add(sec, req.Value, req.Replace)
	if errors.Is(err, secret.ErrExist) {
		return nil, fail(CodeConflict, err, "--replace stores a new value (a new version) in its place")
	}
	if err != nil {
		return nil, usage("", "%v", err)
	}
	return &SecretResult{Secret: out}, nil
}

// SecretList lists the secrets the caller may use: an operator's, all.
func (s *Service) SecretList(ctx context.Context, c *Call, req *Empty) (*SecretListResult, error) {
	all, err := s.secrets().List()
	if err != nil {
		return nil, err
	}
	res := &SecretListResult{Secrets: []secret.Secret{}}
	for _, sec := range all {
		if mayUseSecret(c.Caller, &sec) {
			res.Secrets = append(res.Secrets, sec)
		}
	}
	return res, nil
}

// SecretUpdateRequest gives a secret a new value (a new version), and new metadata if set.
type SecretUpdateRequest struct {
	Name     string            `json:"name"` // its name or E2B id
	Value    []byte            `json:"value"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// SecretUpdate gives a secret of the caller's a new value: running Benches use it from their next
// request on.
func (s *Service) SecretUpdate(ctx context.Context, c *Call, req *SecretUpdateRequest) (*SecretResult, error) {
	st := s.secrets()
	sec, err := st.Get(req.Name)
	if err == nil && !mayUseSecret(c.Caller, &sec) {
		err = fmt.Errorf("secret %s: %w", req.Name, secret.ErrNotFound)
	}
	if err != nil {
		return nil, fail(CodeNotFound, err, "`shed secret ls` lists your secrets")
	}
	out, err := st.Update(sec.Name, req.Value, req.Metadata)
	if err != nil {
		return nil, usage("", "%v", err)
	}
	return &SecretResult{Secret: out}, nil
}

// SecretRemove revokes a secret: a Bench that uses it is refused from its next request on.
func (s *Service) SecretRemove(ctx context.Context, c *Call, req *SecretRequest) (*SecretResult, error) {
	st := s.secrets()
	sec, err := st.Get(req.Name)
	if err == nil && !mayUseSecret(c.Caller, &sec) {
		err = fmt.Errorf("secret %s: %w", req.Name, secret.ErrNotFound) // another's is not shown to exist
	}
	if err != nil {
		return nil, fail(CodeNotFound, err, "`shed secret ls` lists your secrets")
	}
	if _, err := st.Remove(sec.Name); err != nil {
		return nil, err
	}
	return &SecretResult{Secret: sec}, nil
}

// mayUseSecret says whether the caller may see, name and remove sec: operators any, users their own.
func mayUseSecret(c *Caller, sec *secret.Secret) bool {
	return c.Role == Operator || sec.Owner != "" && sec.Owner == c.User
}

// benchSecrets checks that the caller may use the secrets named (by the launch and the recipe) and
// those its injections name, and gives the Bench their lookup: each as it is now allowed (its id and
// owner), so that one removed and added again, or given to another user, is revoked for the Bench.
func (s *Service) benchSecrets(c *Caller, names []string, inject []proxy.Injection) (*bench.Secrets, error) {
	if len(names) == 0 && len(inject) == 0 {
		return nil, nil
	}
	for i, in := range inject {
		if err := proxy.CheckInjection(in); err != nil {
			return nil, usage("a host (or *.name), a header name and a value without control characters", "inject[%d]: %v", i, err)
		}
	}
	st := s.secrets()
	sc := &bench.Secrets{Inject: inject, Lookup: secretLookup(st)}
	allow := func(n string, named bool) error {
		sec, err := st.Get(n)
		if err == nil && !mayUseSecret(c, &sec) {
			err = fmt.Errorf("secret %s: %w", n, secret.ErrNotFound)
		}
		if err != nil {
			return fail(CodeNotFound, err, "`shed secret ls` lists the secrets you may use; `shed secret add` stores one")
		}
		if named && !slices.Contains(sc.Names, sec.Name) {
			sc.Names = append(sc.Names, sec.Name) // by its name, however it was named (an E2B id)
		}
		if !slices.ContainsFunc(sc.Refs, func(r bench.SecretRef) bool { return r.Name == sec.Name }) {
			sc.Refs = append(sc.Refs, bench.SecretRef{Name: sec.Name, ID: sec.ID, Owner: sec.Owner})
		}
		return nil
	}
	for _, n := range names {
		if err := allow(n, true); err != nil {
			return nil, err
		}
	}
	for _, in := range inject {
		for _, n := range proxy.SecretRefs(in.Value) {
			if err := allow(n, false); err != nil {
				return nil, err
			}
		}
	}
	slices.Sort(sc.Names)
	return sc, nil
}

// secretLookup reads a secret as it is now (bench.Secrets narrows it to the ones allowed).
func secretLookup(st *secret.Store) func(string) (*secret.Secret, []byte, error) {
	return func(name string) (*secret.Secret, []byte, error) {
		sec, v, err := st.Value(name)
		if errors.Is(err, secret.ErrNotFound) {
			return nil, nil, nil
		}
		if err != nil {
			return nil, nil, err
		}
		return &sec, v, nil
	}
}
