// Package sibling finds shed's other programs: the small `shed` runs shed-cli, shed-cli runs
// shed-serve for the servers, and every launch runs shed-init. Each is looked for beside the running
// executable, then in ../libexec/shed/, where `make install` puts all but shed.
package sibling

import (
	"fmt"
	"os"
	"path/filepath"
)

// Find returns the path of the program called name, beside this executable or in ../libexec/shed/.
func Find(name string) (string, error) {
	self, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return "", err
	}
	dir := filepath.Dir(self)
	libexec := filepath.Join(filepath.Dir(dir), "libexec", "shed")
	for _, p := range []string{filepath.Join(dir, name), filepath.Join(libexec, name)} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no %s beside %s nor in %s", name, self, libexec)
}
