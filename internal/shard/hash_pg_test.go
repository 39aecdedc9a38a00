package shard

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cdc-outbox/cdc-outbox/internal/testenv"
)

// TestHashMatchesTheServer: Hash is the server's hashtext for every length
// up to 200 bytes (each tail of lookup3's 12-byte blocks, and each
// alignment), unicode, the empty string, and ids as services write them.
// A mismatch would put a message and the rows of one aggregate in two
// shards.
func TestHashMatchesTheServer(t *testing.T) {
	url := testenv.PostgresURL(t)
	conn := testenv.Connect(t, url)
	rng := rand.New(rand.NewPCG(35, 1))
	alphabet := []rune("abcXYZ019-_ éüß€😀漢字\t")
	var inputs []string
	for n := range 200 {
		var b strings.Builder
		for range n {
			b.WriteRune(alphabet[rng.IntN(len(alphabet))])
		}
		inputs = append(inputs, b.String(), strings.Repeat("a", n))
	}
	for i := range 300 {
		inputs = append(inputs, fmt.Sprintf("order-%d", i), fmt.Sprintf("%08x-4e5f-4a6b-8c7d-%012x", rng.Uint32(), rng.Uint64()&0xffffffffffff))
	}
	inputs = append(inputs, strings.Repeat("long ", 2000))
	var server []int32
	if err := conn.QueryRow(testenv.Context(t), `SELECT array_agg(hashtext(s) ORDER BY i) FROM unnest($1::text[]) WITH ORDINALITY AS u(s, i)`, inputs).Scan(&server); err != nil {
		t.Fatal(err)
	}
	if len(server) != len(inputs) {
		t.Fatalf("the server hashed %d of %d strings", len(server), len(inputs))
	}
	bad := 0
	for i, s := range inputs {
		if got := int32(Hash(s)); got != server[i] {
			bad++
			if bad <= 5 {
				t.Errorf("Hash(%q) (%d bytes) = %d, the server's hashtext = %d", s, len(s), got, server[i])
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d strings hash otherwise than on the server", bad, len(inputs))
	}
}
