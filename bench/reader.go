package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// readBacklog is the second reference: the least a Go program must do to
// take a slot's backlog off the server with the same protocol and plugin
// options as the streamer. It receives and discards every message, counts
// the inserts, and sends a status update only every 10 s, so what it
// measures is the walsender's decoding plus the wire, not a client. It stops
// once the stream has passed end: an XLogData at or beyond it, or a
// keepalive whose ServerWALEnd is at or beyond it (the walsender sends
// those once it has decoded and sent everything up to that point).
func readBacklog(ctx context.Context, url, slot, publication string, end pglogrepl.LSN) (inserts int, err error) {
	conn, err := startReading(ctx, url, slot, publication)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	// next waits without a context; cancellation closes the connection.
	stop := context.AfterFunc(ctx, func() { _ = conn.Conn().Close() })
	defer stop()

	const statusEvery = 10 * time.Second
	var received pglogrepl.LSN
	lastStatus := time.Now()
	for {
		x, k, err := next(conn)
		if err != nil {
			if ctx.Err() != nil {
				return inserts, ctx.Err()
			}
			return inserts, err
		}
		if x != nil {
			if len(x.WALData) > 0 && x.WALData[0] == 'I' {
				inserts++
			}
			received = max(received, x.WALStart)
			if x.WALStart >= end {
				return inserts, nil
			}
		} else {
			if k.ServerWALEnd >= end {
				return inserts, nil
			}
			if k.ReplyRequested {
				lastStatus = time.Time{} // answer now
			}
		}
		if time.Since(lastStatus) >= statusEvery {
			err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: received})
			if err != nil {
				return inserts, err
			}
			lastStatus = time.Now()
		}
	}
}

// commitDelays is the steady-load reference: it streams a slot like the
// streamer does, but only notes for each transaction how long after its
// commit the Begin message arrived (the message carries the commit time,
// taken by the server on this machine's clock). That is the walsender's
// share of commit→ack latency: the least any client can have on this
// machine at this rate. It answers the server every second with what it
// received, so the slot does not hold WAL, and records a delay only while
// measuring is set. It returns when ctx ends.
func commitDelays(ctx context.Context, url, slot string, measuring *atomic.Bool) ([]time.Duration, error) {
	conn, err := startReading(ctx, url, slot, publication)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	stop := context.AfterFunc(ctx, func() { _ = conn.Conn().Close() })
	defer stop()

	var delays []time.Duration
	var received pglogrepl.LSN
	lastStatus := time.Now()
	for {
		x, _, err := next(conn)
		now := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return delays, nil
			}
			return delays, err
		}
		if x != nil {
			received = max(received, x.WALStart)
			if len(x.WALData) > 0 && x.WALData[0] == 'B' && measuring.Load() {
				lm, err := pglogrepl.Parse(x.WALData)
				if err != nil {
					return delays, err
				}
				delays = append(delays, now.Sub(lm.(*pglogrepl.BeginMessage).CommitTime))
			}
		}
		if now.Sub(lastStatus) >= time.Second {
			err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: received})
			if err != nil {
				return delays, err
			}
			lastStatus = now
		}
	}
}

// next receives the stream's next message: an XLogData or a keepalive
// (exactly one is not nil), or the error that ended the stream. It waits
// with context.Background(), which skips pgconn's per-call context watcher
// (a goroutine hand-off per message); callers cancel by closing the
// connection.
func next(conn *pgconn.PgConn) (*pglogrepl.XLogData, *pglogrepl.PrimaryKeepaliveMessage, error) {
	for {
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			return nil, nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return nil, nil, err
				}
				return &x, nil, nil
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return nil, nil, err
				}
				return nil, &k, nil
			}
		case *pgproto3.ErrorResponse:
			return nil, nil, pgconn.ErrorResponseToPgError(m)
		default:
			return nil, nil, fmt.Errorf("unexpected message %T", msg)
		}
	}
}

// startReading opens a replication connection and starts streaming slot
// from its confirmed position, with the plugin options the streamer uses.
func startReading(ctx context.Context, url, slot, publication string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "cdc-outbox-bench-reader"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'",
		"publication_names " + quoteLiteral(pgx.Identifier{publication}.Sanitize()),
	}})
	if err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("start replication: %w", err)
	}
	return conn, nil
}
