package replication

import (
	"testing"

	"github.com/cdc-outbox/cdc-outbox/outbox/pgname"
)

func TestWatches(t *testing.T) {
	ps, err := pgname.ParseList(`public.outbox, tenant_*.outbox, *."Events", "odd*".x*, app.*`)
	if err != nil {
		t.Fatal(err)
	}
	ws, odd := watches(ps, nil)
	want := []Watch{{"tenant_*", "outbox", ""}, {"*", "Events", ""}, {"app", "*", ""}}
	if len(ws) != len(want) {
		t.Fatalf("watches %v, want %v", ws, want)
	}
	for i := range want {
		if ws[i] != want[i] {
			t.Errorf("watch %d: %v, want %v", i, ws[i], want[i])
		}
	}
	if len(odd) != 1 || odd[0].String() != `"odd*".x*` {
		t.Errorf("odd %v, want the pattern whose quoted part holds *", odd)
	}
}

func TestMembershipCommand(t *testing.T) {
	for _, c := range []struct {
		database, publication string
		ws                    []Watch
		want                  string
	}{
		{"app", "cdc_outbox", []Watch{{"tenant_*", "outbox", ""}, {"*", "events", ""}},
			`psql -d app -v ON_ERROR_STOP=1 -f sql/outbox-membership.sql -c "SELECT cdc_outbox.watch('cdc_outbox', 'tenant_*', 'outbox'); SELECT cdc_outbox.watch('cdc_outbox', '*', 'events')"`},
		{"it's mine", "p", nil, `psql -d 'it'\''s mine' -v ON_ERROR_STOP=1 -f sql/outbox-membership.sql`},
		{"db", "o'brien", []Watch{{"s", "t", ""}}, `psql -d db -v ON_ERROR_STOP=1 -f sql/outbox-membership.sql -c "SELECT cdc_outbox.watch('o''brien', 's', 't')"`},
		// A shard's pattern: with its row filter.
		{"app", "p_shard_1_of_2", []Watch{{"tenant_*", "outbox", `(hashtext("aggregate_id") & 2147483647) % 2 = 1`}},
			`psql -d app -v ON_ERROR_STOP=1 -f sql/outbox-membership.sql -c "SELECT cdc_outbox.watch('p_shard_1_of_2', 'tenant_*', 'outbox', '(hashtext(\"aggregate_id\") & 2147483647) % 2 = 1')"`},
	} {
		if got := MembershipCommand(c.database, c.publication, c.ws); got != c.want {
			t.Errorf("MembershipCommand(%q, %q, %v):\n got %s\nwant %s", c.database, c.publication, c.ws, got, c.want)
		}
	}
}
