package recipe

import (
	"fmt"
	"slices"
	"strings"
)

// DebianSuites are the suite names Debian's archive has used: every release's codename, the
// aliases that follow the releases, and the suffixes of the suites beside a release. A recipe
// whose seed names a suite close to one of these but not one of them is a typo that `recipe check`
// catches offline; a name far from all of them (a release named after this list was written) is
// left to the mirror, which realize asks.
var (
	debianCodenames = []string{"buzz", "rex", "bo", "hamm", "slink", "potato", "woody", "sarge", "etch", "lenny",
		"squeeze", "wheezy", "jessie", "stretch", "buster", "bullseye", "bookworm", "trixie", "forky", "duke",
		"sid", "experimental"}
	debianAliases  = []string{"stable", "testing", "unstable", "oldstable", "oldoldstable"}
	debianSuffixes = []string{"updates", "backports", "backports-sloppy", "proposed-updates", "security"}
)

// DebianSuiteExamples are the suites a hint offers: the releases Debian serves and their aliases.
const debianSuiteExamples = "bookworm, trixie, forky, sid, stable, testing, unstable, oldstable (add -updates or -backports for those suites)"

// checkDebianSuite reports a suite of Debian's default mirror that is a near miss of a known one.
func checkDebianSuite(seed Seed) *Error {
	suite := seed.Suite
	base, suffix, hasSuffix := strings.Cut(suite, "-")
	known := slices.Concat(debianCodenames, debianAliases)
	var guess string
	switch {
	case !slices.Contains(known, base):
		s := Suggest(base, known, 1)
		if len(s) == 0 {
			return nil // perhaps a release newer than this list: the mirror will say
		}
		guess = s[0]
		if hasSuffix {
			guess += "-" + suffix
		}
	case hasSuffix && !slices.Contains(debianSuffixes, suffix):
		s := Suggest(suffix, debianSuffixes, 1)
		if len(s) == 0 {
			return nil
		}
		guess = base + "-" + s[0]
	default:
		return nil
	}
	return &Error{Msg: fmt.Sprintf("Debian has no suite %q: did you mean %q?", suite, guess),
		Hint: fmt.Sprintf("write seed = %q; Debian's suites are %s", strings.Replace(seed.Raw, suite, guess, 1), debianSuiteExamples)}
}

// Suggest returns up to n of candidates that are likely what s was meant to be (a typo: a few
// letters changed, missing, added or swapped), closest first. It returns none when s is itself a
// candidate.
func Suggest(s string, candidates []string, n int) []string {
	type scored struct {
		c string
		d int
	}
	var out []scored
	for _, c := range candidates {
		if c == s {
			return nil
		}
		if d := editDistance(strings.ToLower(s), strings.ToLower(c)); d <= typoDistance(c) {
			out = append(out, scored{c, d})
		}
	}
	slices.SortStableFunc(out, func(a, b scored) int { return a.d - b.d })
	var names []string
	for _, o := range out {
		if len(names) == n {
			break
		}
		if !slices.Contains(names, o.c) {
			names = append(names, o.c)
		}
	}
	return names
}

// typoDistance is how far a word may be from c and still be taken as a typo of it: one edit in a
// short word, two in a longer one (a short word is one edit away from many others).
func typoDistance(c string) int {
	switch {
	case len(c) <= 3:
		return 0
	case len(c) <= 5:
		return 1
	}
	return 2
}

// DebianSuites lists the suite names of Debian's archive known here: the codenames and aliases,
// then each of them with the suffixes of the suites beside a release (bookworm-backports).
func DebianSuites() []string {
	out := slices.Concat(debianCodenames, debianAliases)
	for _, s := range slices.Concat(debianCodenames, debianAliases) {
		for _, x := range debianSuffixes {
			out = append(out, s+"-"+x)
		}
	}
	return out
}
