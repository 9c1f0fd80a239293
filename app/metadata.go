package app

import (
	"fmt"
	"regexp"
	"sync"

	"toolshed.dev/shed/bench"
)

var metadataKeyRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile("^[A-Za-z0-9!#$%&'*+\\-.^_`|~]+$") })

// checkMetadata refuses metadata that could not travel as the E2B API's headers (keys are HTTP
// tokens, values printable ASCII) or not be kept (package bench's bounds).
func checkMetadata(md map[string]string) error {
	total := 0
	for k, v := range md {
		if !metadataKeyRE().MatchString(k) || len(k) > bench.MaxMetadataKey {
			return usage(fmt.Sprintf("keys of letters, digits and !#$%%&'*+-.^_`|~, at most %d bytes", bench.MaxMetadataKey), "metadata key %.64q", k)
		}
		for _, r := range v {
			if r < 0x20 || r > 0x7e {
				return usage("values of printable ASCII", "metadata value of %q: %.64q", k, v)
			}
		}
		if total += len(k) + len(v); total > bench.MaxMetadataBytes {
			return usage(fmt.Sprintf("at most %d bytes of keys and values", bench.MaxMetadataBytes), "metadata of more than %d bytes", bench.MaxMetadataBytes)
		}
	}
	return nil
}
