package consume

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Cleanup deletes the processed_events rows of every group processed more
// than olderThan ago (by the database clock), at most batchSize rows per
// statement so that no statement holds many locks or runs long, and returns
// how many it deleted. Run it periodically (a cron job, a ticker); it is
// safe to run concurrently with consumers and with itself.
//
// The retention, olderThan, must exceed the longest time after which an
// event can still be delivered again: once its row is gone, a redelivery is
// processed a second time. Redeliveries come from cdc-outbox restarts
// (seconds), from consumer restarts and rebalances before an offset commit
// (one poll's worth, minutes at most), and from anyone resetting a group's
// offsets or replaying a topic, which reaches back as far as the topic's
// retention.ms. Days to weeks is typical; at least the topics' retention if
// offsets may ever be reset.
func Cleanup(ctx context.Context, pool *pgxpool.Pool, olderThan time.Duration, batchSize int) (int64, error) {
	switch {
	case pool == nil:
		return 0, fmt.Errorf("consume: Cleanup: pool is nil")
	case olderThan <= 0:
		return 0, fmt.Errorf("consume: Cleanup: olderThan is %v; give the retention, longer than any redelivery can be late", olderThan)
	case batchSize <= 0:
		return 0, fmt.Errorf("consume: Cleanup: batchSize is %d; give a positive number, e.g. 1000", batchSize)
	}
	// One cutoff for the whole run, from the clock that set processed_at.
	var cutoff time.Time
	if err := pool.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`, olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("consume: Cleanup: %w", err)
	}
	var total int64
	for {
		// Oldest first through processed_events_processed_at; SKIP LOCKED
		// leaves rows another Cleanup is deleting to it.
		tag, err := pool.Exec(ctx, `
			DELETE FROM processed_events p
			USING (SELECT consumer_group, event_id FROM processed_events
			       WHERE processed_at < $1
			       ORDER BY processed_at
			       LIMIT $2
			       FOR UPDATE SKIP LOCKED) old
			WHERE p.consumer_group = old.consumer_group AND p.event_id = old.event_id`, cutoff, batchSize)
		if err != nil {
			return total, fmt.Errorf("consume: Cleanup: delete rows processed before %s: %w", cutoff.Format(time.RFC3339), err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return total, nil
		}
	}
}
