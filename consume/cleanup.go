package consume

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DefaultCleanupBatchSize is Cleanup's batch size when it is given 0.
const DefaultCleanupBatchSize = 1000

// Cleanup deletes the processed_events rows of every group processed more
// than olderThan ago (by the database clock, from one cutoff taken when it
// starts), at most batchSize rows per statement (0 means
// DefaultCleanupBatchSize) so that no statement holds many locks or runs
// long, and returns how many it deleted. Run it periodically (a cron job, a
// ticker); it is safe to run concurrently with consumers and with itself.
//
// The retention, olderThan, must exceed the longest time after which an
// event can still be delivered again: once its row is gone, a redelivery is
// processed a second time. Redeliveries come from cdc-outbox restarts
// (seconds), from consumer restarts and rebalances before an offset commit
// (one poll's worth, minutes at most), and from anyone resetting a group's
// offsets or replaying a topic, which reaches back as far as the topic's
// retention.ms. Days to weeks is typical; at least the topics' retention if
// offsets may ever be reset.
func Cleanup(ctx context.Context, db DB, olderThan time.Duration, batchSize int) (int64, error) {
	switch {
	case db == nil:
		return 0, errors.New("consume: Cleanup: nil DB")
	case olderThan <= 0:
		return 0, fmt.Errorf("consume: Cleanup: olderThan %v is not positive", olderThan)
	case batchSize < 0:
		return 0, fmt.Errorf("consume: Cleanup: batchSize %d is negative", batchSize)
	case batchSize == 0:
		batchSize = DefaultCleanupBatchSize
	}
	// One cutoff for the whole run, from the clock that set processed_at.
	var cutoff time.Time
	if err := db.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`, olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("consume: Cleanup: %w", err)
	}
	var total int64
	for {
		// Oldest first through processed_events_processed_at; SKIP LOCKED
		// leaves rows another Cleanup is deleting to it.
		tag, err := db.Exec(ctx, `
			DELETE FROM processed_events p
			USING (SELECT consumer_group, source, event_id FROM processed_events
			       WHERE processed_at < $1
			       ORDER BY processed_at
			       LIMIT $2
			       FOR UPDATE SKIP LOCKED) old
			WHERE p.consumer_group = old.consumer_group AND p.source = old.source AND p.event_id = old.event_id`, cutoff, batchSize)
		if err != nil {
			return total, fmt.Errorf("consume: Cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return total, nil
		}
	}
}
