package builder

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"

	"toolshed.dev/shed/cache"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/store"
	"toolshed.dev/shed/trust"
)

// FetchItem is one file to fetch: a fixed-output derivation's output path, its
// URLs (tried in order; the first is the one the lock recorded) and its
// expected SHA-256 and size (size 0 = unknown).
type FetchItem struct {
	Path   store.Path
	URLs   []string
	SHA256 string // lowercase hex
	Size   int64
	Name   string // for messages and progress, e.g. "jq_1.6-2.1_amd64.deb (jq 1.6-2.1)"
}

// FetchOptions tune Fetch.
type FetchOptions struct {
	// Parallel is the number of concurrent downloads; 0 (or less) means 4.
	Parallel int
	// Retries is the number of attempts per URL after the first on transient
	// errors (network errors, 5xx, 408, 429, a short or stalled body); 0 means
	// 3 and a negative number none. Attempts wait 0.5 s, 1 s, 2 s, ... between
	// them, and stop waiting when ctx is done.
	Retries int
	// Client is the HTTP client; nil means one with sane timeouts (connect
	// 10 s, response header 30 s, and no overall timeout, since files may be
	// big: a body that stalls for a minute is cut and retried instead).
	Client *http.Client
	// Progress hears about downloads; nil means silent (libraries are silent).
	Progress ProgressReporter
	// Offline forbids the network: a missing path is an error naming it.
	Offline bool
}

// FetchResult says what happened to each item. Paths appear once each, in the
// order of the items that asked for them.
type FetchResult struct {
	Fetched []store.Path // downloaded now
	Present []store.Path // already valid in the store: not fetched again
	Bytes   int64        // bytes of the files downloaded now
}

// Sentinel errors of Fetch, checked with errors.Is.
var (
	// ErrGone: every URL of an item answered 404 or 410, the case "the mirror
	// no longer serves a pinned version". Callers add a hint (re-lock, or a
	// snapshot mirror).
	ErrGone = errors.New("no longer served")
	// ErrHashMismatch: a server sent bytes other than the pinned ones.
	ErrHashMismatch = errors.New("hash mismatch")
	// ErrOffline: a path is missing and Offline forbade fetching it.
	ErrOffline = errors.New("missing and offline")
)

const (
	defaultParallel = 4
	defaultRetries  = 3
	firstBackoff    = 500 * time.Millisecond
	// stallTimeout cuts a body that sends nothing for this long: without an
	// overall timeout, a silent server would otherwise hang a fetch forever.
	stallTimeout = 60 * time.Second
	// progressEvery throttles FileProgress: a reporter needs a few updates a
	// second, not one per network read.
	progressEvery = 100 * time.Millisecond
	userAgent     = "toolshed-shed (fixed-output fetch)"
)

// defaultClient is shared so that calls reuse connections to the same mirror.
var defaultClient = &http.Client{
	Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   defaultParallel * 2,
		ForceAttemptHTTP2:     true,
		// We want the bytes the server stores, never a transparently
		// decompressed variant of them: the hash is over the stored bytes.
		DisableCompression: true,
	},
}

// Fetch makes every item valid in s. Items already valid are not fetched
// (whatever recipe asked for them earlier), and items naming the same path
// (the same file from two mirrors) are fetched once, trying all their URLs.
//
// Each download streams into the store's staging area through s.Realize,
// which also guarantees that processes fetching the same path at once fetch it
// once, while hashing it; size and SHA-256 are checked before the build
// function returns, so a mismatch registers nothing and leaves no bytes in the
// store. The stored file has mode 0444 and mtime 1.
//
// The error joins one error per failed item (errors.Join), each naming the
// item, the URL and what happened. An item whose every URL answered 404 or 410
// wraps ErrGone; a wrong file wraps ErrHashMismatch; a missing item when
// offline wraps ErrOffline. The result is never nil: it holds what was done
// before any failure.
func Fetch(ctx context.Context, s *store.Store, items []FetchItem, opts FetchOptions) (*FetchResult, error) {
	res := &FetchResult{}
	jobs, err := mergeItems(s, items)
	if err != nil {
		return res, err
	}
	if len(jobs) == 0 {
		return res, nil
	}

	// Root every path before looking at it, as the gc protocol wants: a path
	// that is valid after its root was added stays valid while we run.
	paths := make([]store.Path, len(jobs))
	for i, j := range jobs {
		paths[i] = j.item.Path
	}
	if err := s.AddTempRoots(ctx, paths); err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	var missing []*fetchJob
	for _, j := range jobs {
		if s.IsValid(j.item.Path) {
			j.present = true
		} else {
			missing = append(missing, j)
		}
	}

	var errs []error
	if opts.Offline {
		for _, j := range missing {
			errs = append(errs, fmt.Errorf("fetch %s: %s is %w", j.item.Name, j.item.Path, ErrOffline))
		}
		missing = nil
	}
	for _, j := range missing {
		if len(j.item.URLs) == 0 {
			errs = append(errs, fmt.Errorf("fetch %s: no URL to fetch %s from", j.item.Name, j.item.Path))
			j.skip = true
		}
	}
	missing = slices.DeleteFunc(missing, func(j *fetchJob) bool { return j.skip })

	if len(missing) > 0 {
		f := newFetcher(s, opts)
		parallel := opts.Parallel
		if parallel <= 0 {
			parallel = defaultParallel
		}
		errs = append(errs, f.run(ctx, missing, parallel)...)
	}

	for _, j := range jobs {
		switch {
		case j.present:
			res.Present = append(res.Present, j.item.Path)
		case j.fetched:
			res.Fetched = append(res.Fetched, j.item.Path)
			res.Bytes += j.bytes
		}
	}
	return res, errors.Join(errs...)
}

func newFetcher(s *store.Store, opts FetchOptions) *fetcher {
	f := &fetcher{
		s:       s,
		client:  cmp.Or(opts.Client, defaultClient),
		retries: opts.Retries,
		backoff: firstBackoff,
	}
	if f.retries == 0 {
		f.retries = defaultRetries
	} else if f.retries < 0 {
		f.retries = 0
	}
	if opts.Progress != nil {
		f.progress = &lockedProgress{r: opts.Progress}
	}
	return f
}

// Refetch downloads a registered fetch output again and puts it back in place of damaged or missing
// bytes (store.Repair): the file must match both its pinned SHA-256 and its registered content.
func Refetch(ctx context.Context, s *store.Store, it FetchItem, opts FetchOptions) (int64, error) {
	if opts.Offline {
		return 0, fmt.Errorf("fetch %s: %s is %w", it.Name, it.Path, ErrOffline)
	}
	f := newFetcher(s, opts)
	if f.progress != nil {
		f.progress.Start(1, it.Size)
		defer f.progress.Done()
	}
	var n int64
	err := s.Repair(ctx, it.Path, 1, func(ctx context.Context, out string) error {
		var err error
		n, err = f.download(ctx, it, out)
		return err
	})
	return n, err
}

// fetchJob is one distinct path to make valid.
type fetchJob struct {
	item    FetchItem // URLs merged from every item naming the path
	present bool      // valid without downloading (already, or built by another process)
	fetched bool      // downloaded by this call
	skip    bool
	bytes   int64
	err     error
}

// mergeItems checks the items and merges those naming the same path. The
// checks catch caller bugs (a path that does not belong to the hash), so they
// fail the whole call before anything touches the network.
func mergeItems(s *store.Store, items []FetchItem) ([]*fetchJob, error) {
	var (
		jobs   []*fetchJob
		byPath = map[store.Path]*fetchJob{}
		errs   []error
	)
	for i, it := range items {
		if it.Name == "" && !it.Path.IsZero() {
			it.Name = it.Path.Name()
		}
		if err := checkItem(s, it); err != nil {
			errs = append(errs, fmt.Errorf("fetch item %d (%s): %w", i, it.Name, err))
			continue
		}
		if j, ok := byPath[it.Path]; ok {
			for _, u := range it.URLs {
				if !slices.Contains(j.item.URLs, u) {
					j.item.URLs = append(j.item.URLs, u)
				}
			}
			if j.item.Size == 0 {
				j.item.Size = it.Size
			}
			continue
		}
		it.URLs = slices.Clone(it.URLs)
		j := &fetchJob{item: it}
		byPath[it.Path] = j
		jobs = append(jobs, j)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return jobs, nil
}

func checkItem(s *store.Store, it FetchItem) error {
	if it.Path.IsZero() {
		return errors.New("no store path")
	}
	if len(it.SHA256) != sha256.Size*2 || strings.ToLower(it.SHA256) != it.SHA256 {
		return fmt.Errorf("sha256 %q is not 64 lowercase hex digits", it.SHA256)
	}
	if _, err := hex.DecodeString(it.SHA256); err != nil {
		return fmt.Errorf("sha256 %q is not 64 lowercase hex digits", it.SHA256)
	}
	if it.Size < 0 {
		return fmt.Errorf("negative size %d", it.Size)
	}
	want, err := store.MakePath("fixed:sha256", it.SHA256, s.StoreDir(), it.Path.Name())
	if err != nil {
		return err
	}
	if want != it.Path {
		return fmt.Errorf("path %s is not the fixed output of sha256 %s (want %s)", it.Path, it.SHA256, want)
	}
	return nil
}

type fetcher struct {
	s        *store.Store
	client   *http.Client
	reposMu  sync.Mutex
	repos    map[string]*remote.Repository // by HOST/REPO: the registries of oci:// blob URLs
	retries  int
	backoff  time.Duration
	progress ProgressReporter // nil: silent
}

// run fetches the jobs with parallel workers and returns one error per failed job.
func (f *fetcher) run(ctx context.Context, jobs []*fetchJob, parallel int) []error {
	if f.progress != nil {
		var total int64
		for _, j := range jobs {
			if j.item.Size == 0 {
				total = 0 // one unknown size makes the total unknown
				break
			}
			total += j.item.Size
		}
		f.progress.Start(len(jobs), total)
		defer f.progress.Done()
	}
	var (
		wg      sync.WaitGroup
		queue   = make(chan *fetchJob)
		skipped bool
	)
	for range min(parallel, len(jobs)) {
		wg.Go(func() {
			for j := range queue {
				j.err = f.one(ctx, j)
			}
		})
	}
feed:
	for _, j := range jobs {
		if ctx.Err() != nil {
			skipped = true
			break
		}
		select {
		case queue <- j:
		case <-ctx.Done():
			skipped = true
			break feed
		}
	}
	close(queue)
	wg.Wait()
	// Errors in item order, not completion order: stable messages.
	var errs []error
	for _, j := range jobs {
		if j.err != nil {
			errs = append(errs, j.err)
		}
	}
	if skipped {
		// Items never started have no error of their own; say why once.
		errs = append(errs, fmt.Errorf("fetch: %w", ctx.Err()))
	}
	return errs
}

// one makes a single path valid.
func (f *fetcher) one(ctx context.Context, j *fetchJob) error {
	it := j.item
	// The provenance's fetch log: where the bytes came from and what every byte hashed to.
	facts := &trust.Facts{}
	opts := store.AddOptions{CA: "fixed:sha256:" + it.SHA256, Epoch: 1, Facts: facts}
	var n int64
	_, built, err := f.s.Realize(ctx, it.Path, opts, func(ctx context.Context, out string) error {
		var err error
		n, err = f.download(ctx, it, out)
		if err == nil && len(it.URLs) > 0 {
			facts.Fetches = []trust.Fetch{{URL: it.URLs[0], SHA256: it.SHA256, Size: n}}
		}
		return err
	})
	if err != nil {
		var fe *fetchError
		if errors.As(err, &fe) {
			return err // already names the item and the URLs
		}
		return fmt.Errorf("fetch %s: %w", it.Name, err)
	}
	if built {
		j.fetched, j.bytes = true, n
	} else {
		j.present = true // another process fetched it while we waited for its lock
	}
	return nil
}

// download tries the item's URLs in order and leaves the verified file at out.
func (f *fetcher) download(ctx context.Context, it FetchItem, out string) (n int64, err error) {
	if f.progress != nil {
		f.progress.FileStart(it.Name, it.Size)
		defer func() { f.progress.FileDone(it.Name, err) }()
	}
	var failures []urlError
	for _, u := range it.URLs {
		n, err := f.tryURL(ctx, it, u, out)
		if err == nil {
			return n, nil
		}
		if ctx.Err() != nil {
			return 0, &fetchError{name: it.Name, urls: []urlError{{u, ctx.Err()}}}
		}
		failures = append(failures, urlError{u, err})
	}
	return 0, &fetchError{name: it.Name, urls: failures}
}

// tryURL fetches from one URL, retrying transient failures with backoff.
func (f *fetcher) tryURL(ctx context.Context, it FetchItem, u string, out string) (int64, error) {
	if pu, err := url.Parse(u); err != nil {
		return 0, fmt.Errorf("bad url: %w", err)
	} else if pu.Scheme != "http" && pu.Scheme != "https" && pu.Scheme != "oci" {
		return 0, fmt.Errorf("unsupported url scheme %q", pu.Scheme)
	}
	delay := f.backoff
	for attempt := 0; ; attempt++ {
		n, err := f.attempt(ctx, it, u, out)
		if err == nil {
			return n, nil
		}
		var te *transientError
		if !errors.As(err, &te) || attempt >= f.retries || ctx.Err() != nil {
			if errors.As(err, &te) && attempt > 0 {
				return 0, fmt.Errorf("%w (after %d attempts)", err, attempt+1)
			}
			return 0, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
		delay *= 2
	}
}

// attempt is one GET of u into out. The file is recreated on every attempt,
// so a retry never appends to the bytes of a cut one.
func (f *fetcher) attempt(ctx context.Context, it FetchItem, u string, out string) (n int64, err error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var req *http.Request
	client := doer(f.client)
	if strings.HasPrefix(u, "oci://") {
		req, client, err = f.registryGet(actx, u)
	} else {
		req, err = http.NewRequestWithContext(actx, http.MethodGet, u, nil)
	}
	if err != nil {
		return 0, fmt.Errorf("bad request: %w", err)
	}
	// An explicit identity encoding also keeps a caller's client from
	// decompressing: the pinned hash is of the bytes as served.
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Set("User-Agent", userAgent)
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if errors.Is(cache.ErrUnauthorizedOf(err), cache.ErrUnauthorized) {
			return 0, hint.Wrap(err, registryLoginHint)
		}
		return 0, &transientError{err}
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return 0, &goneError{code: resp.StatusCode}
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
		return 0, &transientError{fmt.Errorf("HTTP %s", resp.Status)}
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		if strings.HasPrefix(u, "oci://") {
			return 0, hint.Wrap(fmt.Errorf("HTTP %s", resp.Status), registryLoginHint)
		}
		return 0, fmt.Errorf("HTTP %s", resp.Status)
	default:
		return 0, fmt.Errorf("HTTP %s", resp.Status)
	}
	if it.Size > 0 && resp.ContentLength >= 0 && resp.ContentLength != it.Size {
		return 0, fmt.Errorf("%w: server announces %d bytes, expected %d bytes of sha256 %s", ErrHashMismatch, resp.ContentLength, it.Size, it.SHA256)
	}

	file, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", out, err)
	}
	defer func() {
		if cerr := file.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write %s: %w", out, cerr)
		}
	}()

	h := sha256.New()
	pw := &progressWriter{r: f.progress, name: it.Name}
	fw := &fileWriter{f: file}
	body := io.Reader(resp.Body)
	if it.Size > 0 {
		// One byte past the expected size is enough to know it is wrong; a
		// server streaming forever must not fill the disk.
		body = io.LimitReader(body, it.Size+1)
	}
	body = &stallReader{r: body, cancel: cancel, timeout: stallTimeout}
	n, err = io.Copy(io.MultiWriter(fw, h, pw), body)
	pw.flush()
	switch {
	case err == nil:
	case fw.err != nil:
		return n, fmt.Errorf("write %s: %w", out, fw.err) // the disk, not the network: no retry
	case ctx.Err() != nil:
		return n, ctx.Err()
	case errors.Is(context.Cause(actx), errStalled):
		return n, &transientError{fmt.Errorf("%w after %d bytes", errStalled, n)}
	default:
		// A reset connection, a body shorter than its Content-Length or a
		// broken chunk: all worth another try.
		return n, &transientError{fmt.Errorf("body cut after %d bytes: %w", n, err)}
	}
	if it.Size > 0 && n < it.Size {
		// A connection-delimited body can end early without an error.
		return n, &transientError{fmt.Errorf("body cut after %d of %d bytes", n, it.Size)}
	}
	got := hex.EncodeToString(h.Sum(nil))
	if it.Size > 0 && n > it.Size {
		return n, fmt.Errorf("%w: more than the expected %d bytes (sha256 %s)", ErrHashMismatch, it.Size, it.SHA256)
	}
	if got != it.SHA256 {
		return n, fmt.Errorf("%w: expected sha256 %s, got sha256 %s (%d bytes)", ErrHashMismatch, it.SHA256, got, n)
	}
	if err := file.Chmod(0o444); err != nil {
		return n, fmt.Errorf("chmod %s: %w", out, err)
	}
	return n, nil
}

// fileWriter remembers a write error, to tell a full disk from a cut connection.
type fileWriter struct {
	f   *os.File
	err error
}

func (w *fileWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	if err != nil {
		w.err = err
	}
	return n, err
}

var errStalled = fmt.Errorf("no data for %s", stallTimeout)

// stallReader cancels the request when a read does not return within timeout.
type stallReader struct {
	r       io.Reader
	cancel  context.CancelCauseFunc
	timeout time.Duration
}

func (s *stallReader) Read(p []byte) (int, error) {
	t := time.AfterFunc(s.timeout, func() { s.cancel(errStalled) })
	defer t.Stop()
	return s.r.Read(p)
}

// progressWriter reports cumulative bytes, at most every progressEvery.
type progressWriter struct {
	r    ProgressReporter
	name string
	n    int64
	last time.Time
}

func (w *progressWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	if w.r != nil && time.Since(w.last) >= progressEvery {
		w.last = time.Now()
		w.r.FileProgress(w.name, w.n)
	}
	return len(p), nil
}

// flush reports the final count, which throttling may have held back.
func (w *progressWriter) flush() {
	if w.r != nil {
		w.r.FileProgress(w.name, w.n)
	}
}

// transientError marks a failure worth retrying at the same URL.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// goneError is a 404 or 410 from one URL; only when every URL says so is the
// item ErrGone.
type goneError struct{ code int }

func (e *goneError) Error() string { return fmt.Sprintf("HTTP %d %s", e.code, http.StatusText(e.code)) }

type urlError struct {
	url string
	err error
}

// fetchError is the error of one item: what each of its URLs did.
type fetchError struct {
	name string
	urls []urlError
}

func (e *fetchError) allGone() bool {
	for _, u := range e.urls {
		var g *goneError
		if !errors.As(u.err, &g) {
			return false
		}
	}
	return len(e.urls) > 0
}

func (e *fetchError) Error() string {
	if e.allGone() {
		parts := make([]string, len(e.urls))
		for i, u := range e.urls {
			parts[i] = fmt.Sprintf("%s (%v)", u.url, u.err)
		}
		return fmt.Sprintf("fetch %s: %v by %s", e.name, ErrGone, strings.Join(parts, ", nor by "))
	}
	if len(e.urls) == 1 {
		return fmt.Sprintf("fetch %s from %s: %v", e.name, e.urls[0].url, e.urls[0].err)
	}
	parts := make([]string, len(e.urls))
	for i, u := range e.urls {
		parts[i] = fmt.Sprintf("%s: %v", u.url, u.err)
	}
	return fmt.Sprintf("fetch %s: every URL failed: %s", e.name, strings.Join(parts, "; "))
}

func (e *fetchError) Unwrap() []error {
	errs := make([]error, 0, len(e.urls)+1)
	if e.allGone() {
		errs = append(errs, ErrGone)
	}
	for _, u := range e.urls {
		errs = append(errs, u.err)
	}
	return errs
}

// lockedProgress serializes calls, so that a reporter needs no locking of its
// own for one Fetch.
type lockedProgress struct {
	mu sync.Mutex
	r  ProgressReporter
}

func (l *lockedProgress) Start(total int, totalBytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.r.Start(total, totalBytes)
}

func (l *lockedProgress) FileStart(name string, size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.r.FileStart(name, size)
}

func (l *lockedProgress) FileProgress(name string, done int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.r.FileProgress(name, done)
}

func (l *lockedProgress) FileDone(name string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.r.FileDone(name, err)
}

func (l *lockedProgress) Done() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.r.Done()
}

// doer sends a request: an *http.Client, or a registry's auth client, which answers the registry's
// challenges with its credentials.
type doer interface {
	Do(*http.Request) (*http.Response, error)
}

const registryLoginHint = "the registry wants credentials: `docker login HOST` or `podman login HOST` (an image seed's registry gets only the credentials those files keep for its host)"

// manifestAccept is what a manifest GET accepts: the image manifests shed reads.
const manifestAccept = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"

// registryGet turns an image's blob or manifest URL as a derivation names it,
// oci://HOST[:PORT]/REPO/blobs/sha256:HEX or oci://HOST[:PORT]/REPO/manifests/sha256:HEX, into the
// registry's request for it, sent by the fetcher's own client (its timeouts) wrapped in the
// registry's auth client (its credentials, which never reach the derivation or the log, and its
// token flow, scoped to pull from the repository). Repositories are opened once per fetcher, so that
// a token serves every blob of an image.
func (f *fetcher) registryGet(ctx context.Context, u string) (*http.Request, doer, error) {
	rest := strings.TrimPrefix(u, "oci://")
	kind, i := "blobs", strings.LastIndex(rest, "/blobs/")
	if j := strings.LastIndex(rest, "/manifests/"); j > i {
		kind, i = "manifests", j
	}
	if i < 0 {
		return nil, nil, fmt.Errorf("bad image url %q: want oci://HOST/REPO/blobs/sha256:HEX or oci://HOST/REPO/manifests/sha256:HEX", u)
	}
	ref, dgst := rest[:i], rest[i+len("/"+kind+"/"):]
	if !strings.HasPrefix(dgst, "sha256:") || strings.Contains(dgst, "/") {
		return nil, nil, fmt.Errorf("bad image url %q: want a sha256 digest at its end", u)
	}
	f.reposMu.Lock()
	repo := f.repos[ref]
	if repo == nil {
		var err error
		if repo, err = cache.Repository(ref); err != nil {
			f.reposMu.Unlock()
			return nil, nil, fmt.Errorf("registry %s: %w", ref, err)
		}
		if ac, ok := repo.Client.(*auth.Client); ok {
			c := *ac
			c.Client = f.client
			repo.Client = &c
		}
		if f.repos == nil {
			f.repos = map[string]*remote.Repository{}
		}
		f.repos[ref] = repo
	}
	f.reposMu.Unlock()
	scheme := "https"
	if repo.PlainHTTP {
		scheme = "http"
	}
	// Host, not Registry: docker.io's API is served at registry-1.docker.io.
	get := fmt.Sprintf("%s://%s/v2/%s/%s/%s", scheme, repo.Reference.Host(), repo.Reference.Repository, kind, dgst)
	req, err := http.NewRequestWithContext(auth.AppendRepositoryScope(ctx, repo.Reference, auth.ActionPull), http.MethodGet, get, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("bad request: %w", err)
	}
	if kind == "manifests" {
		req.Header.Set("Accept", manifestAccept)
	}
	return req, repo.Client, nil
}
