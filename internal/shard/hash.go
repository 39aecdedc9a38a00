package shard

import "math/bits"

// Hash is PostgreSQL's hashtext(s) for a text of a deterministic collation
// (the default): hash_bytes, Bob Jenkins' lookup3, over the text's bytes,
// as src/common/hashfn.c computes it on a little-endian server (x86-64,
// arm64). A big-endian server (s390x) computes other values: a stream's
// start compares this with the server's own hashtext, and refuses shards
// on a difference rather than split the messages and rows of one aggregate
// over two shards.
func Hash(s string) uint32 {
	n := len(s)
	a := 0x9e3779b9 + uint32(n) + 3923095
	b, c := a, a
	k := s
	for len(k) >= 12 {
		a += word(k[0:])
		b += word(k[4:])
		c += word(k[8:])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	// The tail, as hash_bytes adds it on little-endian machines: the lowest
	// byte of c is left to the length, which the seed already holds.
	switch len(k) {
	case 11:
		c += uint32(k[10]) << 24
		fallthrough
	case 10:
		c += uint32(k[9]) << 16
		fallthrough
	case 9:
		c += uint32(k[8]) << 8
		fallthrough
	case 8:
		b += word(k[4:])
		a += word(k[0:])
	case 7:
		b += uint32(k[6]) << 16
		fallthrough
	case 6:
		b += uint32(k[5]) << 8
		fallthrough
	case 5:
		b += uint32(k[4])
		fallthrough
	case 4:
		a += word(k[0:])
	case 3:
		a += uint32(k[2]) << 16
		fallthrough
	case 2:
		a += uint32(k[1]) << 8
		fallthrough
	case 1:
		a += uint32(k[0])
	}
	_, _, c = final(a, b, c)
	return c
}

// word is the little-endian 32-bit word at the start of k.
func word(k string) uint32 {
	return uint32(k[0]) | uint32(k[1])<<8 | uint32(k[2])<<16 | uint32(k[3])<<24
}

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func final(a, b, c uint32) (uint32, uint32, uint32) {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return a, b, c
}
