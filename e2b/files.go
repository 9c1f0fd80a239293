package e2b

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/e2b/envd/filesystem"
	"toolshed.dev/shed/e2b/envd/filesystem/filesystemconnect"
)

func connectCode(c app.Code) connect.Code {
	switch c {
	case app.CodeNotFound:
		return connect.CodeNotFound
	case app.CodeUsage, app.CodeInvalid, app.CodeBadRequest:
		return connect.CodeInvalidArgument
	case app.CodeDenied:
		return connect.CodePermissionDenied
	case app.CodeConflict:
		return connect.CodeAlreadyExists
	case app.CodeBusy:
		return connect.CodeResourceExhausted
	}
	return connect.CodeInternal
}

// connectError is an operation's error as a Connect error: its message and hint.
func connectError(err error) error {
	e := app.Classify(err)
	msg := e.Error()
	if e.Hint != "" {
		msg += " (hint: " + e.Hint + ")"
	}
	return connect.NewError(connectCode(e.Code), errors.New(msg))
}

// dataCaller authenticates an envd HTTP request (/files): the sandbox's token, and the user.
func (s *Server) dataCaller(w http.ResponseWriter, r *http.Request) (*sandbox, *app.Caller) {
	sb, c, err := s.byToken(r.Header)
	if err != nil {
		writeError(w, http.StatusUnauthorized, "%v", errNoSandbox)
		return nil, nil
	}
	if _, err := sb.account(r.URL.Query().Get("username")); err != nil {
		e := app.Classify(err)
		writeError(w, http.StatusUnauthorized, "invalid username: %v (hint: %s)", e, e.Hint)
		return nil, nil
	}
	return sb, c
}

// slot takes one of the sandbox's file-operation slots for the request, or answers why not.
func slot(w http.ResponseWriter, r *http.Request, sb *sandbox) func() {
	release, err := sb.fileSlot(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "the request ended while waiting for the sandbox's other file operations")
		return nil
	}
	return release
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	sb, c := s.dataCaller(w, r)
	if sb == nil {
		return
	}
	release := slot(w, r, sb)
	if release == nil {
		return
	}
	defer release()
	p, status, err := sb.filePath(r, r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, status, "%v", err)
		return
	}
	res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.read_file", &app.ReadFileRequest{Bench: sb.bench, Path: p})
	if err != nil {
		writeAppError(w, err)
		return
	}
	content := res.(*app.FileResult).Content
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", fmt.Sprint(len(content)))
	_, _ = io.WriteString(w, content)
}

// writeInfo is what envd answers for each file written.
type writeInfo struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// writeFile writes the files of a POST /files: one body (application/octet-stream, at the path the
// query names) or a multipart form (each part "file", at the query's path or the part's file name).
// However many files, it is one bench.write_files: one command in the Bench and one audit entry. A
// form of more than app.MaxWriteFiles parts, or more than app.MaxWriteBytes of contents, is refused
// whole, before anything is written.
func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	sb, c := s.dataCaller(w, r)
	if sb == nil {
		return
	}
	release := slot(w, r, sb)
	if release == nil {
		return
	}
	defer release()
	body := http.MaxBytesReader(w, r.Body, app.MaxWriteBytes+1<<20)
	queryPath := r.URL.Query().Get("path")
	var files []app.FileWrite
	total := 0
	// add reads one file's data, within what is left of the request's bounds.
	add := func(p string, data io.Reader) bool {
		if p == "" {
			writeError(w, http.StatusBadRequest, "name the file's path (the path query or the part's file name)")
			return false
		}
		b, err := io.ReadAll(io.LimitReader(data, int64(app.MaxWriteBytes-total)+1))
		if tooBig := (*http.MaxBytesError)(nil); errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "a body of more than %d bytes: write the files in more requests", tooBig.Limit)
			return false
		} else if err != nil {
			writeError(w, http.StatusBadRequest, "body: %v", err)
			return false
		}
		if total += len(b); total > app.MaxWriteBytes {
			writeError(w, http.StatusRequestEntityTooLarge, "%s: more than %d bytes in one request; write them in parts (and join them with a command)", p, app.MaxWriteBytes)
			return false
		}
		abs, status, err := sb.filePath(r, p)
		if err != nil {
			writeError(w, status, "%v", err)
			return false
		}
		files = append(files, app.FileWrite{Path: abs, Content: string(b)})
		return true
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case mt == "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		for parts := 0; ; parts++ {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, "multipart body: %v", err)
				return
			}
			// Parts that are not files count too: each costs the parse.
			if parts == app.MaxWriteFiles {
				writeError(w, http.StatusRequestEntityTooLarge, "more than %d parts in one request: write the files in more requests", app.MaxWriteFiles)
				return
			}
			if part.FormName() != "file" {
				continue
			}
			p := queryPath
			if p == "" {
				// The SDK names each file of a multi-file write by its whole path; FileName would keep
				// only its last element.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				p = dp["filename"]
			}
			if !add(p, part) {
				return
			}
		}
	default:
		var in io.Reader = body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(body)
			if err != nil {
				writeError(w, http.StatusBadRequest, "gzip body: %v", err)
				return
			}
			in = zr
		}
		if !add(queryPath, in) {
			return
		}
	}
	out := []writeInfo{}
	if len(files) > 0 {
		md := metadataOf(r.Header)
		res, err := s.Service.Do(r.Context(), &app.Call{Caller: c}, "bench.write_files", &app.WriteFilesRequest{Bench: sb.bench, Files: files, Metadata: md, User: r.URL.Query().Get("username")})
		if err != nil {
			writeAppError(w, err)
			return
		}
		for _, p := range res.(*app.WriteFilesResult).Paths {
			out = append(out, writeInfo{Name: path.Base(p), Type: "file", Path: p, Metadata: md})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// metadataOf is the metadata a write's X-Metadata-KEY headers give (as envd reads them: keys in lower
// case, the first value of a key).
func metadataOf(h http.Header) map[string]string {
	var md map[string]string
	for name, values := range h {
		k, ok := strings.CutPrefix(strings.ToLower(name), "x-metadata-")
		if !ok || k == "" || len(values) == 0 {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[k] = values[0]
	}
	return md
}

type filesystemService struct{ s *Server }

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// do runs an operation for a filesystem RPC, as the sandbox's user, on its Bench.
func (fs *filesystemService) do(ctx context.Context, h http.Header, op string, req func(bench string) any) (any, error) {
	sb, c, err := fs.s.byToken(h)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, errNoSandbox)
	}
	if err := checkUser(sb, h); err != nil {
		return nil, err
	}
	release, err := sb.fileSlot(ctx)
	if err != nil {
		return nil, connect.NewError(connect.CodeCanceled, err)
	}
	defer release()
	res, err := fs.s.Service.Do(ctx, &app.Call{Caller: c}, op, req(sb.bench))
	if err != nil {
		return nil, connectError(err)
	}
	return res, nil
}

// path makes an RPC's path absolute for its user (rpcPath), once the sandbox is known.
func (fs *filesystemService) path(h http.Header, p string) (string, error) {
	sb := fs.s.sandboxOf(h)
	if sb == nil {
		return "", connect.NewError(connect.CodeUnauthenticated, errNoSandbox)
	}
	return sb.rpcPath(h, p)
}

// entryInfo is a Bench's file as envd describes one (its filesystem.GetEntryInfo): mode is the
// permission bits alone (0o755, never Go's ModeDir bit), permissions is Go's rendering of the whole
// mode ("drwxr-xr-x"); a symlink is described by what it resolves to (its type and permission
// bits, symlinkTarget its resolved absolute path, or its own path if it resolves to nothing) but
// for its name, path, size and permissions ("Lrwxrwxrwx").
func entryInfo(e *app.FileEntry) *filesystem.EntryInfo {
	mode := fs.FileMode(e.Mode & 0o777)
	if e.Mode&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if e.Mode&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if e.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	fileType := map[string]filesystem.FileType{"file": filesystem.FileType_FILE_TYPE_FILE, "dir": filesystem.FileType_FILE_TYPE_DIRECTORY}
	t, perm := fileType[e.Type], uint32(e.Mode&0o777)
	switch e.Type {
	case "dir":
		mode |= fs.ModeDir
	case "symlink":
		mode |= fs.ModeSymlink
		t, perm = fileType[e.TargetType], e.TargetMode&0o777
	}
	info := &filesystem.EntryInfo{
		Name: e.Name, Type: t, Path: e.Path, Size: e.Size, Mode: perm, Permissions: mode.String(),
		Owner: e.Owner, Group: e.Group, ModifiedTime: timestamppb.New(e.Modified),
	}
	if e.Type == "symlink" {
		target := e.Resolved
		if target == "" {
			target = e.Path
		}
		info.SymlinkTarget = &target
	}
	info.Metadata = e.Metadata
	return info
}

func (fs *filesystemService) stat(ctx context.Context, h http.Header, p string) (*filesystem.EntryInfo, error) {
	res, err := fs.do(ctx, h, "bench.stat_file", func(b string) any { return &app.BenchPathRequest{Bench: b, Path: p} })
	if err != nil {
		return nil, err
	}
	return entryInfo(res.(*app.FileEntry)), nil
}

func (fs *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	p, err := fs.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := fs.stat(ctx, req.Header(), p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (fs *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	p, err := fs.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	user := basicUser(req.Header())
	res, err := fs.do(ctx, req.Header(), "bench.make_dir", func(b string) any { return &app.BenchPathRequest{Bench: b, Path: p, User: user} })
	if err != nil {
		return nil, err
	}
	if !res.(*app.MadeResult).Created {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s exists", p))
	}
	e, err := fs.stat(ctx, req.Header(), p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (fs *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	from, err := fs.path(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	to, err := fs.path(req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	user := basicUser(req.Header())
	res, err := fs.do(ctx, req.Header(), "bench.move_file", func(b string) any { return &app.MoveFileRequest{Bench: b, From: from, To: to, User: user} })
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entryInfo(res.(*app.FileEntry))}), nil
}

func (fs *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	p, err := fs.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	res, err := fs.do(ctx, req.Header(), "bench.list_files", func(b string) any {
		return &app.ListFilesRequest{Bench: b, Path: p, Depth: int(req.Msg.GetDepth())}
	})
	if err != nil {
		return nil, err
	}
	out := &filesystem.ListDirResponse{}
	for i := range res.(*app.ListFilesResult).Entries {
		out.Entries = append(out.Entries, entryInfo(&res.(*app.ListFilesResult).Entries[i]))
	}
	return connect.NewResponse(out), nil
}

func (fs *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	p, err := fs.path(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	// envd removes with os.RemoveAll: a path that is not there is no error.
	if _, err := fs.do(ctx, req.Header(), "bench.remove_file", func(b string) any { return &app.RemoveFileRequest{Bench: b, Path: p, MissingOK: true} }); err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
