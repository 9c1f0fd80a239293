// Package lines reads text a line at a time with a bound on a line's length that never ends the
// reading: a line longer than the bound is cut at it, the rest of that line is skipped, and the next
// line is read as usual. bufio.Scanner instead stops at its first line over 64 KiB and reports it only
// to a caller that checks Err, so whoever writes one long line (an agent naming a host to its proxy)
// hides every line after it from a caller that does not.
package lines

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// Each calls fn with each line of r, without its "\n" or "\r\n" (as bufio.ScanLines). A line longer
// than max bytes is passed cut to its first max bytes, with cut true; its rest is read and dropped. A
// last line without "\n" is a line. line is valid only during the call. Each returns fn's first error,
// or r's first error other than io.EOF.
func Each(r io.Reader, max int, fn func(line []byte, cut bool) error) error {
	br := bufio.NewReaderSize(r, max+1)
	for {
		line, err := br.ReadSlice('\n')
		full := errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !full && !errors.Is(err, io.EOF) {
			return err
		}
		if errors.Is(err, io.EOF) && len(line) == 0 {
			return nil
		}
		cut := full
		if !full {
			line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		}
		if len(line) > max {
			line, cut = line[:max], true
		}
		if ferr := fn(line, cut); ferr != nil {
			return ferr
		}
		for full {
			_, err = br.ReadSlice('\n')
			full = errors.Is(err, bufio.ErrBufferFull)
		}
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
	}
}
