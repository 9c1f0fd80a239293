package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"toolshed.dev/shed/app"
)

// The limit flags' values are read here, each error naming the flag, what was given, the form it
// takes and its least value: urfave/cli's own ("invalid value ... parse error") says none of these.

// maxSize is the largest size a flag takes (8 EiB less a bit: the kernel's cgroup files are int64s).
const maxSize = 1 << 62

// sizeForm is how a size is written, for errors.
const sizeForm = "a number with a unit, K, M, G or T (powers of 1024): 512M, 4G"

// memoryFlag reads a memory limit flag: unset or 0 is none, else a size of at least app.MinMemory.
func memoryFlag(c *cli.Context, name string) (int64, error) {
	s := c.String(name)
	if s == "" {
		return 0, nil
	}
	n, unit, err := parseSizeUnit(s)
	if err != nil {
		return 0, sizeError(name, s, err)
	}
	if n != 0 && n < app.MinMemory {
		why := fmt.Sprintf("--%s %s: below the least a Bench can run in, %s", name, s, formatSize(app.MinMemory))
		hint := "write at least 16M: e.g. 512M or 4G (0 for no limit)"
		if !unit {
			why = fmt.Sprintf("--%s %s: %d bytes (a number without a unit is bytes) is below the least a Bench can run in, %s", name, s, n, formatSize(app.MinMemory))
			hint = fmt.Sprintf("give it a unit: %sM, or 512M, 4G (at least 16M)", strings.TrimSpace(s))
		}
		return 0, withHint(exitUsage, fmt.Errorf("%s", why), hint)
	}
	return n, nil
}

// sizeFlag reads a size flag with no least value (0 included), e.g. gc's --max-freed.
func sizeFlag(c *cli.Context, name string) (int64, error) {
	s := c.String(name)
	if s == "" {
		return 0, nil
	}
	n, _, err := parseSizeUnit(s)
	if err != nil {
		return 0, sizeError(name, s, err)
	}
	return n, nil
}

func sizeError(name, s string, err error) error {
	return withHint(exitUsage, fmt.Errorf("--%s %q: %v", name, s, err), "write "+sizeForm+"; a number without a unit is bytes")
}

// countFlag reads a count flag: a whole number from least to most (most 0: no bound). An unset flag
// is its default.
func countFlag(c *cli.Context, name string, least, most int64, what string) (int64, error) {
	s := strings.TrimSpace(c.String(name))
	if s == "" {
		return 0, nil
	}
	form := fmt.Sprintf("a whole number, at least %d", least)
	if most > 0 {
		form = fmt.Sprintf("a whole number from %d to %d", least, most)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, withHint(exitUsage, fmt.Errorf("--%s %q: not a number: %s is %s", name, c.String(name), what, form), "write "+form)
	}
	if n < least {
		return 0, withHint(exitUsage, fmt.Errorf("--%s %d: below the least, %d: %s", name, n, least, what), "write "+form)
	}
	if most > 0 && n > most {
		return 0, withHint(exitUsage, fmt.Errorf("--%s %d: above the most, %d: %s", name, n, most, what), "write "+form)
	}
	return n, nil
}

// durationFlag reads a duration flag in whole seconds, at least least (unset: 0).
func durationFlag(c *cli.Context, name string, least time.Duration) (time.Duration, error) {
	s := strings.TrimSpace(c.String(name))
	if s == "" {
		return 0, nil
	}
	hint := fmt.Sprintf("write a duration with a unit, at least %s: 30s, 5m, 1h30m", least)
	d, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseInt(s, 10, 64); nerr == nil {
			return 0, withHint(exitUsage, fmt.Errorf("--%s %q: a duration needs a unit (s, m or h)", name, s), fmt.Sprintf("write %ss for seconds", s))
		}
		return 0, withHint(exitUsage, fmt.Errorf("--%s %q: not a duration", name, s), hint)
	}
	if d < least {
		return 0, withHint(exitUsage, fmt.Errorf("--%s %s: below the least, %s", name, s, least), hint)
	}
	if d%time.Second != 0 {
		return 0, withHint(exitUsage, fmt.Errorf("--%s %s: not a whole number of seconds", name, s), hint)
	}
	return d, nil
}

// parseSize reads "123", "10K", "500M", "2G", "1T" (powers of 1024, optional trailing "B" or "iB").
func parseSize(s string) (int64, error) {
	n, _, err := parseSizeUnit(s)
	return n, err
}

// parseSizeUnit is parseSize, and whether s had a unit.
func parseSizeUnit(s string) (int64, bool, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	unit := false
	if u, ok := strings.CutSuffix(t, "B"); ok && u != "" {
		t, unit = strings.TrimSuffix(u, "I"), true
	}
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t, unit = t[:len(t)-1], true
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || t == "" || t[0] == '+' {
		return 0, false, errors.New("not a size")
	}
	if n < 0 {
		return 0, false, fmt.Errorf("a size is not negative")
	}
	if n > maxSize/mult {
		return 0, false, fmt.Errorf("too large: at most %s", formatSize(maxSize))
	}
	return n * mult, unit, nil
}
