// Package recipe owns workshop.toml: its format, and the strict parsing and
// validation that turn it into a Recipe.
//
// A recipe is the only truth about an environment and is reviewed as a plain
// diff, so this package refuses anything a reviewer could misread: unknown keys,
// wrong types, names that are not plain ASCII (homoglyphs, invisible and
// bidirectional characters), apt and pip options smuggled in as package names,
// grants of shed's own store or state, network destinations on the host or its
// local network, and credentials in URLs (a recipe never holds a secret).
//
// Every grammar is closed and checked before anything else happens. A bad recipe
// yields one *Error, the first in file order, naming the file, the line and the
// field (as a dotted TOML path such as apt.packages[1]), with a hint saying what
// to do. The grammar checkers are exported (ParseAptPackage, ParsePipPackage,
// ParseHost, CheckGrantPath) so that command-line input is held to the same rules.
//
// The package imports no other package of this project: it describes what an
// environment declares; compiling that into derivations is done elsewhere.
package recipe
