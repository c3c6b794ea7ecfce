package ledger

import "math"

// residentArena holds the residents' stream names and tails (residents) in
// pages of bytes, which hold no pointer for the garbage collector to follow:
// a block of a power-of-two size (16 bytes to residentBlockMax) for each,
// a freed block kept for the next one of its size. It never shrinks: its
// pages are those its most blocks in use at once took, at most twice their
// bytes (the rounding) plus what a page's end could not fit.
type residentArena struct {
	pages [][]byte // arenaPage bytes each
	used  int      // bytes handed out of the last page
	free  [arenaClasses][]uint32
}

const (
	arenaPage = 1 << 20
	arenaUnit = 16 // a block's offset is counted in these: 64 GiB of blocks
	// residentBlockMax is the longest name and tail a resident may have:
	// an account whose metadata and active holds take more is not kept
	// resident (it loads cold).
	residentBlockMax = 64 << 10
	arenaClasses     = 13 // 16 bytes << 0..12
)

// arenaClass is the size class of a block of n bytes and its size.
func arenaClass(n int) (class, size int) {
	for size = arenaUnit; size < n; size <<= 1 {
		class++
	}
	return class, size
}

// alloc is a block of at least n bytes (n <= residentBlockMax); ok is false
// when the arena has no offset left for it.
func (a *residentArena) alloc(n int) (block uint32, ok bool) {
	c, size := arenaClass(n)
	if f := a.free[c]; len(f) > 0 {
		block = f[len(f)-1]
		a.free[c] = f[:len(f)-1]
		return block, true
	}
	if len(a.pages) == 0 || a.used+size > arenaPage {
		if uint64(len(a.pages)+1)*arenaPage/arenaUnit > math.MaxUint32 {
			return 0, false
		}
		a.pages = append(a.pages, make([]byte, arenaPage))
		a.used = 0
	}
	off := (len(a.pages)-1)*arenaPage + a.used
	a.used += size
	return uint32(off / arenaUnit), true
}

// at is the first n bytes of block.
func (a *residentArena) at(block uint32, n int) []byte {
	off := int(block) * arenaUnit
	o := off % arenaPage
	return a.pages[off/arenaPage][o : o+n : o+n]
}

// release frees block, allocated for n bytes.
func (a *residentArena) release(block uint32, n int) {
	c, _ := arenaClass(n)
	a.free[c] = append(a.free[c], block)
}
