package e2b

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/secret"
)

// E2B's secrets (the SDK's Secret: create, list, getInfo, update, destroy) are the supervisor's
// (package secret, the app layer's secret.* operations), called as the key's user: a key's user owns
// what it creates and sees, updates, removes and names in a sandbox's network.rules only its own (an
// operator's key: any). A value goes in with create and update and never comes out: every answer is
// E2B's Secret, metadata only. A sandbox uses one by a header transform at create (network.go):
// ${e2b.secrets.NAME} in a header's value, which the Bench's proxy replaces at egress, at every
// request, by the value as it is then; a secret removed is refused from the next request on.

// secretJSON is E2B's Secret.
type secretJSON struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int               `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"` // always an object, as E2B's
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}

func secretOf(s secret.Secret) secretJSON {
	md := s.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return secretJSON{SecretID: s.ID, Name: s.Name, CurrentVersion: s.Version, Metadata: md, CreatedAt: s.Created, UpdatedAt: s.Updated}
}

// E2B's bounds of a secret's metadata.
const (
	maxSecretMetadata      = 32
	maxSecretMetadataKey   = 128
	maxSecretMetadataValue = 1024
	maxSecretMetadataAll   = 8192
)

// checkSecretMetadata says what is wrong with a secret's metadata, or "".
func checkSecretMetadata(md map[string]string) string {
	if len(md) > maxSecretMetadata {
		return fmt.Sprintf("metadata: %d entries, at most %d", len(md), maxSecretMetadata)
	}
	total := 0
	for k, v := range md {
		switch {
		case k == "":
			return "metadata: an empty key"
		case len(k) > maxSecretMetadataKey:
			return fmt.Sprintf("metadata key %.32q...: %d bytes, at most %d", k, len(k), maxSecretMetadataKey)
		case len(v) > maxSecretMetadataValue:
			return fmt.Sprintf("metadata %q: its value is %d bytes, at most %d", k, len(v), maxSecretMetadataValue)
		}
		total += len(k) + len(v)
	}
	if total > maxSecretMetadataAll {
		return fmt.Sprintf("metadata: %d bytes in all, at most %d", total, maxSecretMetadataAll)
	}
	return ""
}

// secretBody reads a create's or an update's body: only the fields E2B defines (a field shed would
// ignore is refused), value a string, metadata an object of strings.
func secretBody(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(b) > maxBody {
		writeError(w, http.StatusBadRequest, "body: at most %d bytes of JSON", maxBody)
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		// The decoder's message names a field or a type, never a value.
		writeError(w, http.StatusBadRequest, "body: %v", err)
		return false
	}
	return true
}

// createSecret is POST /secrets (Secret.create): 201 with the Secret; a name taken is 409.
func (s *Server) createSecret(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	var body struct {
		Name     *string           `json:"name"`
		Value    *string           `json:"value"`
		Metadata map[string]string `json:"metadata"`
	}
	if !secretBody(w, r, &body) {
		return
	}
	switch {
	case body.Name == nil || *body.Name == "":
		writeError(w, http.StatusBadRequest, "name: required (lowercase letters, digits, '-', '_' and '.')")
		return
	case body.Value == nil || *body.Value == "":
		writeError(w, http.StatusBadRequest, "value: required, a string of 1 to %d bytes", secret.MaxValue)
		return
	}
	if msg := checkSecretMetadata(body.Metadata); msg != "" {
		writeError(w, http.StatusBadRequest, "%s", msg)
		return
	}
	// The key's user owns it, an operator's key too (app makes a user's own anyway).
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "secret.add", &app.SecretAddRequest{
		Name: *body.Name, Value: []byte(*body.Value), Owner: c.User, Metadata: body.Metadata,
	})
	if err != nil && app.Classify(err).Code == app.CodeConflict {
		// The caller's own or another user's: names are one namespace, as E2B's are a project's.
		writeError(w, http.StatusConflict, "secret %q exists already (names are shared by all of this supervisor's users): Secret.update gives yours a new value", strings.ToLower(*body.Name))
		return
	}
	if err != nil {
		writeAppError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, secretOf(res.(*app.SecretResult).Secret))
}

// userSecrets are the secrets the caller may use (secret.ls), by name.
func (s *Server) userSecrets(w http.ResponseWriter, r *http.Request, c *app.Caller) ([]secret.Secret, bool) {
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "secret.ls", &app.Empty{})
	if err != nil {
		writeAppError(w, err)
		return nil, false
	}
	secs := res.(*app.SecretListResult).Secrets
	slices.SortFunc(secs, func(a, b secret.Secret) int { return strings.Compare(a.Name, b.Name) })
	return secs, true
}

// listSecrets is GET /secrets (Secret.list): the caller's secrets by name, limit (1 to 100, default
// 100) a page from nextToken; X-Next-Token names the next page while there is one.
func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	q := r.URL.Query()
	limit := maxListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			writeError(w, http.StatusBadRequest, "limit %q: a number from 1 to %d", v, maxListLimit)
			return
		}
		limit = n
	}
	after := ""
	if v := q.Get("nextToken"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil || secret.CheckName(string(b)) != nil {
			writeError(w, http.StatusBadRequest, "nextToken %q: not one this server's list gave (X-Next-Token)", v)
			return
		}
		after = string(b)
	}
	secs, ok := s.userSecrets(w, r, c)
	if !ok {
		return
	}
	// The page after the name the last one ended at: a secret made or removed meanwhile neither
	// repeats nor shifts it.
	out := []secretJSON{}
	for _, sec := range secs {
		if sec.Name <= after {
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(out[len(out)-1].Name)))
			break
		}
		out = append(out, secretOf(sec))
	}
	writeJSON(w, http.StatusOK, out)
}

// findSecret is the caller's secret the path names (secretID: its id or its name), or nil after
// answering 404: another user's is not found either.
func (s *Server) findSecret(w http.ResponseWriter, r *http.Request, c *app.Caller) *secret.Secret {
	ref := r.PathValue("secretID")
	secs, ok := s.userSecrets(w, r, c)
	if !ok {
		return nil
	}
	for i, sec := range secs {
		if sec.ID == ref || sec.Name == strings.ToLower(ref) {
			return &secs[i]
		}
	}
	writeError(w, http.StatusNotFound, "secret %q not found (Secret.list lists the ones this key may use)", ref)
	return nil
}

// getSecret is GET /secrets/{secretID} (Secret.getInfo, exists).
func (s *Server) getSecret(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	if sec := s.findSecret(w, r, c); sec != nil {
		writeJSON(w, http.StatusOK, secretOf(*sec))
	}
}

// updateSecret is POST /secrets/{secretID} (Secret.update): a new value, a new version, and new
// metadata if given. Running sandboxes use it from their next request on.
func (s *Server) updateSecret(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	var body struct {
		Value    *string           `json:"value"`
		Metadata map[string]string `json:"metadata"`
	}
	if !secretBody(w, r, &body) {
		return
	}
	if body.Value == nil || *body.Value == "" {
		writeError(w, http.StatusBadRequest, "value: required, a string of 1 to %d bytes", secret.MaxValue)
		return
	}
	if msg := checkSecretMetadata(body.Metadata); msg != "" {
		writeError(w, http.StatusBadRequest, "%s", msg)
		return
	}
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "secret.update", &app.SecretUpdateRequest{
		Name: r.PathValue("secretID"), Value: []byte(*body.Value), Metadata: body.Metadata,
	})
	if err != nil {
		writeAppError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, secretOf(res.(*app.SecretResult).Secret))
}

// deleteSecret is DELETE /secrets/{secretID} (Secret.destroy): 204; 404 (the SDK's false) if the
// caller has none of that id or name. A sandbox that uses it is refused from its next request on.
func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	c := s.authorized(w, r)
	if c == nil {
		return
	}
	if _, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "secret.rm", &app.SecretRequest{Name: r.PathValue("secretID")}); err != nil {
		writeAppError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
