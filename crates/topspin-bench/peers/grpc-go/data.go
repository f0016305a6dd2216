package main

import (
	"encoding/binary"
	"math/bits"
	"sync"

	pb "topspin.bench/grpcgo/benchpb"
)

// The data every peer shares (topspin-bench-common's data section, byte for byte): a Rust
// client checks the blobs and students this server returns against its own, so they come from
// the same generator (fastrand 2's WyRand, ported below) with the same seeds.

// k is the number of students per GetStructs reply and the length of their lists.
const k = 34

// blobPoolSize is the size of the random buffers blobs and payloads are sliced from.
const blobPoolSize = 16 << 20

// rng is fastrand 2.x's WyRand: Rng::with_seed, gen_u64, gen_mod_u32/u64, fill.
type rng struct{ s uint64 }

func (r *rng) u64() uint64 {
	r.s += 0x2d358dccaa6c78a5
	hi, lo := bits.Mul64(r.s, r.s^0x8bb84b93962eacc9)
	return lo ^ hi
}

// modU32 is a uniform value in 0..n (Lemire's method, as fastrand's gen_mod_u32).
func (r *rng) modU32(n uint32) uint32 {
	x := uint32(r.u64())
	m := uint64(x) * uint64(n)
	hi, lo := uint32(m>>32), uint32(m)
	if lo < n {
		t := -n % n
		for lo < t {
			x = uint32(r.u64())
			m = uint64(x) * uint64(n)
			hi, lo = uint32(m>>32), uint32(m)
		}
	}
	return hi
}

// modU64 is a uniform value in 0..n (fastrand's gen_mod_u64, which usize ranges use).
func (r *rng) modU64(n uint64) uint64 {
	hi, lo := bits.Mul64(r.u64(), n)
	if lo < n {
		t := -n % n
		for lo < t {
			hi, lo = bits.Mul64(r.u64(), n)
		}
	}
	return hi
}

// i32 is fastrand's Rng::i32(lo..hi).
func (r *rng) i32(lo, hi int32) int32 {
	return lo + int32(r.modU32(uint32(hi-1-lo)+1))
}

// fill is fastrand's Rng::fill: 8 bytes (little-endian) per step, the tail from one more.
func (r *rng) fill(b []byte) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.u64())
	}
	if i < len(b) {
		var t [8]byte
		binary.LittleEndian.PutUint64(t[:], r.u64())
		copy(b[i:], t[:])
	}
}

const alnumChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

func (r *rng) alnum(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alnumChars[r.modU64(uint64(len(alnumChars)))]
	}
	return string(b)
}

func randomBytes(seed uint64) []byte {
	r := rng{seed}
	b := make([]byte, blobPoolSize)
	r.fill(b)
	return b
}

var (
	blobPool = sync.OnceValue(func() []byte { return randomBytes(0x70b50123) })
	payloads = sync.OnceValue(func() []byte { return randomBytes(0xec40) })
	students = sync.OnceValue(makeStudents)
)

// payload is the first n bytes of the echo payload buffer.
func payload(n int) []byte { return payloads()[:n] }

func address(r *rng) *pb.Address {
	return &pb.Address{
		City:    r.alnum(12),
		Zipcode: r.i32(10000, 99999),
		Street:  r.alnum(16),
		Number:  r.i32(1, 32767),
	}
}

func date(r *rng) *pb.Date {
	return &pb.Date{Year: r.i32(1900, 2030), Month: r.i32(1, 13), Day: r.i32(1, 29)}
}

func emails(r *rng) []string {
	v := make([]string, k)
	for i := range v {
		v[i] = r.alnum(37)
	}
	return v
}

func makeStudents() []*pb.Student {
	r := &rng{0x57d}
	v := make([]*pb.Student, k)
	for i := range v {
		s := &pb.Student{
			Name:        r.alnum(43),
			Friends:     r.i32(0, 1000),
			HomeAddress: address(r),
			BirthPlace:  address(r),
			Birth:       date(r),
		}
		s.FavoriteSubjects = make([]*pb.Subject, k)
		for j := range s.FavoriteSubjects {
			s.FavoriteSubjects[j] = &pb.Subject{Id: r.i32(0, 100000), Title: r.alnum(22), Code: r.alnum(16)}
		}
		s.EmailAddresses = emails(r)
		s.Schools = make([]*pb.School, k)
		for j := range s.Schools {
			s.Schools[j] = &pb.School{
				Name:           r.alnum(36),
				Address:        address(r),
				Foundation:     date(r),
				EmailAddresses: emails(r),
			}
		}
		v[i] = s
	}
	return v
}
