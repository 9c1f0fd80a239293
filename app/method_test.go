package app

import (
	"strings"
	"testing"
)

func TestMethodNames(t *testing.T) {
	for _, n := range Operations() {
		if strings.HasPrefix(n, "test.") {
			continue
		}
		o, _ := Lookup(n)
		if o.Method() == "" || o.Method()[0] < 'A' || o.Method()[0] > 'Z' {
			t.Errorf("%s: method %q", n, o.Method())
		}
	}
	if o, _ := Lookup("realize"); o.Method() != "Realize" {
		t.Errorf("realize runs %q", o.Method())
	}
}
