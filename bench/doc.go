// Package bench launches Benches: disposable sandboxes assembled from a
// Workshop's store paths (read-only overlay lower layers) and an empty upper
// layer, with the grants a launch asks for within the recipe's bounds, and a
// network limited to the recipe's profile through an allowlisting proxy.
// The upper is thrown away when the task ends, unless the Bench is kept.
//
// A Bench's state (its record, network log, control socket and, when kept,
// its upper) lives under <root>/benches/<id>, flock-held by the shed process
// that runs it; Sweep removes what dead Benches left.
package bench
