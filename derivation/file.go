package derivation

import (
	"fmt"
	"io"
	"os"
)

// maxDrvSize bounds what Read loads: a .drv is a few kilobytes; anything far
// larger is not one.
const maxDrvSize = 16 << 20

func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxDrvSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if len(b) > maxDrvSize {
		return nil, fmt.Errorf("read %s: larger than %d bytes", name, maxDrvSize)
	}
	return b, nil
}
