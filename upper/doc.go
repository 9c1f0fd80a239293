// Package upper owns the filesystem where branchable Benches' upper layers live: <storeRoot>/uppers.
//
// Each upper is a directory holding upper/ and work/ (overlayfs wants both on one mount). On btrfs each
// is a subvolume, so a snapshot (read-only) or a fork child (writable) is a btrfs snapshot: constant
// time, whatever the upper holds. The store's root is usually not btrfs, so shed keeps a btrfs of its own
// in a preallocated image file, <storeRoot>/uppers.img, loop-mounted at <storeRoot>/uppers; a store
// whose root is on btrfs uses subvolumes there. Without root or without btrfs in the kernel, uppers are
// plain directories and a branch is a copy (cp -a --reflink=auto): the same results, slower.
//
// Uppers are task state: disposable, never store paths. Each change is made under a name of its own
// (".<base>.part" beside the upper) and renamed into place, so a crash leaves either the upper or a
// part that the next Create, Branch or Remove of that name removes.
package upper
