package app

import (
	"errors"
	"testing"
)

// TestHideHostPaths: an agent's face names a record's file by the record, the rest of the store by
// <store>, the socket by what it is; the error's code and hint stay, the paths in its hint go too.
func TestHideHostPaths(t *testing.T) {
	h := HostPaths{Root: "/var/lib/toolshed", Socket: "/run/shed/shed.sock"}
	for in, want := range map[string]string{
		"record jq: /var/lib/toolshed/workshops/jq/3/workshop.lock does not exist": "record jq: Workshop jq v3's workshop.lock does not exist",
		"/var/lib/toolshed/workshops/jq-tools/1/workshop.toml:4: apt.packages":     "Workshop jq-tools v1's workshop.toml:4: apt.packages",
		"layer /var/lib/toolshed/store/abc-jq is damaged":                          "layer <store>/store/abc-jq is damaged",
		"supervisor at /run/shed/shed.sock: connection refused":                    "supervisor at <supervisor socket>: connection refused",
		"read /root/work/out.txt in bench b: No such file":                         "read /root/work/out.txt in bench b: No such file",
	} {
		if got := h.Hide(in); got != want {
			t.Errorf("Hide(%q) = %q, want %q", in, got, want)
		}
	}
	s := &Service{Root: "/var/lib/toolshed"}
	err := s.hideHostPaths(&Error{Code: CodeProblems, Err: errors.New("layer /var/lib/toolshed/store/abc-jq is damaged"),
		Hint: "`shed store verify --repair /var/lib/toolshed/store/abc-jq`"})
	if e := Classify(err); e.Code != CodeProblems || e.Error() != "layer <store>/store/abc-jq is damaged" || e.Hint != "`shed store verify --repair <store>/store/abc-jq`" {
		t.Errorf("hideHostPaths: %v %q %q", e.Code, e.Error(), e.Hint)
	}
}
