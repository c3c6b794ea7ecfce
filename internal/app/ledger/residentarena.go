package ledger

import "math"

// residentArena holds the residents' stream names and tails (residents) in
// pages of bytes, which hold no pointer for the garbage collector to follow:
// a block of a power-of-two size (16 bytes to residentBlockMax) for each,
// a freed block kept for the next one of its size. Freed blocks are never
// merged, so without more its pages would be the sum of each size's peak;
// residents.compact copies the blocks in use into fresh pages once the
// pages exceed twice their bytes and a page (sparse), so the pages stay
// within twice the bytes in use plus a page, those bytes within twice the
// names' and tails' (the rounding).
type residentArena struct {
	pages [][]byte // arenaPage bytes each
	used  int      // bytes handed out of the last page
	live  int      // bytes of the blocks in use
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
	if n > residentBlockMax {
		panic("residentArena: a block longer than residentBlockMax")
	}
	c, size := arenaClass(n)
	if f := a.free[c]; len(f) > 0 {
		block = f[len(f)-1]
		a.free[c] = f[:len(f)-1]
		a.live += size
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
	a.live += size
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
	c, size := arenaClass(n)
	a.free[c] = append(a.free[c], block)
	a.live -= size
}

// held is the bytes of the arena's pages.
func (a *residentArena) held() int { return len(a.pages) * arenaPage }

// sparse reports whether the pages hold more than twice the blocks in use
// and a page: time to compact (residents.compact).
func (a *residentArena) sparse() bool { return a.held() > 2*a.live+arenaPage }
