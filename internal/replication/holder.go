package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrHolderTaken means another process holds the shards of the stream: the
// lock this one held was lost (its connection broke) and taken by the
// other meanwhile.
var ErrHolderTaken = errors.New("another process holds the stream's shards")

// Holder is the one holder of all the shards of a stream: a session
// advisory lock, named after the stream's slot, on a connection of its
// own. A process takes it before it takes any shard's slot and stops every
// shard when it loses it, so that two processes never each hold some of
// the shards; a standby waits for it, and then for the slots the holder
// before it releases.
type Holder struct {
	url, slot string
	interval  time.Duration
	log       *slog.Logger
	conn      *pgx.Conn
	waiting   atomic.Bool
}

// NewHolder is the holder of the shards of the stream whose slot is slot;
// interval is how often it asks for the lock while another process holds
// it, and checks that it still holds it.
func NewHolder(url, slot string, interval time.Duration, log *slog.Logger) *Holder {
	return &Holder{url: url, slot: slot, interval: interval, log: log}
}

// Waiting reports whether another process holds the lock and this one
// waits for it (a standby).
func (h *Holder) Waiting() bool { return h.waiting.Load() }

// pingTimeout bounds the check that the lock's connection is alive.
const pingTimeout = 10 * time.Second

// lock is the advisory lock's two keys: per database, per stream.
const lock = `pg_try_advisory_lock(hashtext('cdc-outbox shards'), hashtext($1))`

// try connects when not connected and asks for the lock once.
func (h *Holder) try(ctx context.Context) (bool, error) {
	if h.conn == nil {
		conn, err := connect(ctx, h.url)
		if err != nil {
			return false, err
		}
		h.conn = conn
	}
	var held bool
	if err := h.conn.QueryRow(ctx, `SELECT `+lock, h.slot).Scan(&held); err != nil {
		h.close()
		return false, fmt.Errorf("take the advisory lock of stream %s's shards: %w", h.slot, err)
	}
	return held, nil
}

func (h *Holder) close() {
	if h.conn != nil {
		_ = h.conn.Close(context.Background())
		h.conn = nil
	}
}

// Take returns once this process holds the lock, asking every interval
// while another holds it or the server cannot be reached, or ctx's error.
func (h *Holder) Take(ctx context.Context) error {
	said := false
	for {
		held, err := h.try(ctx)
		if held {
			h.waiting.Store(false)
			return nil
		}
		switch {
		case err != nil && ctx.Err() == nil:
			h.log.Warn("cannot take the lock of the stream's shards; trying again", "slot", h.slot, "error", err)
		case err == nil && !said:
			h.waiting.Store(true)
			h.log.Info("another process holds the stream's shards: waiting as a standby for it to stop", "slot", h.slot)
			said = true
		}
		select {
		case <-ctx.Done():
			h.close()
			return ctx.Err()
		case <-time.After(h.interval):
		}
	}
}

// Hold checks every interval that the lock is still held until ctx ends
// (then releases it and returns nil). A broken connection loses the lock:
// Hold takes it again on a new one, and returns ErrHolderTaken when another
// process took it meanwhile. While the server cannot be reached it keeps
// trying: the shards' streams cannot reach it either.
func (h *Holder) Hold(ctx context.Context) error {
	defer h.close()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(h.interval):
		}
		if h.conn != nil {
			// Bounded: a connection whose peer went silent (a network
			// cut) answers nothing, and is as lost as a broken one.
			pingCtx, cancel := context.WithTimeout(ctx, pingTimeout)
			err := h.conn.Ping(pingCtx)
			cancel()
			if err == nil {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			h.log.Warn("lost the connection that holds the lock of the stream's shards; taking it again", "slot", h.slot)
			h.close()
		}
		held, err := h.try(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			continue
		case !held:
			return &Error{Err: ErrHolderTaken, Slot: h.slot,
				msg: fmt.Sprintf("another process took the lock of stream %s's shards while this one's connection was lost", h.slot)}
		}
		h.log.Info("holds the lock of the stream's shards again", "slot", h.slot)
	}
}
