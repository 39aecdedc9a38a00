package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Handler consumes the stream. Every method is called from the streaming
// goroutine, except that Room and Failed deliver from elsewhere.
type Handler interface {
	// WAL processes the pgoutput message of one XLogData that starts at lsn.
	// It must not wait on Kafka. An error stops streaming for good, unless
	// it wraps ErrCatalog, or an error with a method Resend() bool that
	// returns true (the handler skipped what it must now read again): then
	// streaming resumes at the confirmed position on a new connection.
	WAL(lsn pglogrepl.LSN, data []byte) error
	// Full reports whether too much is in flight to read more now.
	Full() bool
	// Room receives when an acknowledgement frees room (spurious wake-ups
	// are fine: Full is asked again).
	Room() <-chan struct{}
	// Failed receives an error that arose after WAL returned (the broker
	// refused a record for good); streaming stops with it.
	Failed() <-chan error
	// Lost says the connection broke: the open transaction, if any, will be
	// sent again whole by the server.
	Lost()
	// InFlight is the number of records not yet acknowledged.
	InFlight() int
	// Newest is the end LSN of the newest transaction handed on (to Kafka,
	// or to the position), however far from confirmed: a failover to a
	// timeline that forked before it lost that history.
	Newest() pglogrepl.LSN
}

// Position is the checkpoint as the stream sees it.
type Position interface {
	Confirmed() pglogrepl.LSN
	Idle(walEnd pglogrepl.LSN) bool
	Wait() <-chan struct{}
}

// Config says where and how to stream.
type Config struct {
	// URL is a libpq URL or key=value string (PG* environment variables
	// fill the gaps); replication=database is added here.
	URL         string
	Slot        string
	Publication string
	// StatusInterval is the least time between two status updates when the
	// confirmed position moved: small, so a crash resends little.
	StatusInterval time.Duration
	// KeepaliveInterval is the most time between two status updates, moved
	// or not; it must stay well below the server's wal_sender_timeout.
	KeepaliveInterval time.Duration
	// ShutdownTimeout bounds the wait for in-flight records on shutdown.
	ShutdownTimeout time.Duration
	// ReceiveTimeout is how long the server may stay silent, while the
	// stream reads, before the connection is taken for dead and opened
	// again; a reply is requested at half of it. It also bounds connecting
	// and starting replication. 0 turns it off.
	ReceiveTimeout time.Duration
	// Holding, when set, is called each time the stream takes the slot
	// (replication started on a new connection), before any message is
	// read: for what may only happen while no other process streams from
	// the slot, and for what must be read from whoever held it last (a
	// hot standby takes it hours after it started, an instance that lost
	// its connection may find that another held it meanwhile). An error
	// stops the stream for good, unless it has a method Retry() bool that
	// returns true: then the connection is given up, nothing read, and
	// tried again.
	Holding func(ctx context.Context) error
}

// Stream owns the replication connection.
type Stream struct {
	cfg Config
	h   Handler
	pos Position
	log *slog.Logger

	lastSent   pglogrepl.LSN
	lastSentAt time.Time

	// server is the server streamed from (follow); failover is set while
	// a session runs on a primary promoted since the previous session.
	server   Server
	failover *failover
	// history is the server's timeline history, for Timeline and History
	// (read by other goroutines: under mu).
	mu      sync.Mutex
	history History

	received   atomic.Uint64 // newest server WAL end seen, for metrics
	connected  atomic.Bool
	standby    atomic.Bool // the last attempt found the slot held by another process
	reconnects atomic.Uint64
	updates    atomic.Uint64 // status updates sent
}

// New returns a stream that starts at pos.Confirmed().
func New(cfg Config, h Handler, pos Position, log *slog.Logger) *Stream {
	return &Stream{cfg: cfg, h: h, pos: pos, log: log.With("component", "replication")}
}

// Received is the newest WAL position the server reported.
func (s *Stream) Received() pglogrepl.LSN { return pglogrepl.LSN(s.received.Load()) }

// Connected reports whether a replication connection is streaming: this
// process holds the slot, which PostgreSQL lets one walsender use at a time.
func (s *Stream) Connected() bool { return s.connected.Load() }

// Standby reports whether the last attempt to stream found the slot held
// by another process: the server answered, the slot exists, and this
// process takes it over at its next attempt after the holder released it.
func (s *Stream) Standby() bool { return s.standby.Load() }

// Reconnects counts connections lost and tried again.
func (s *Stream) Reconnects() uint64 { return s.reconnects.Load() }

// StatusUpdates counts the standby status updates sent.
func (s *Stream) StatusUpdates() uint64 { return s.updates.Load() }

// fatal marks errors that reconnecting cannot fix.
type fatal struct{ err error }

func (f fatal) Error() string { return f.err.Error() }
func (f fatal) Unwrap() error { return f.err }

const (
	retryMin   = 100 * time.Millisecond
	retryMax   = 30 * time.Second
	standbyLog = time.Minute // how often a waiting hot standby says so
)

// Run streams until ctx ends (then it drains in-flight records, sends a
// final status update and returns nil) or a fatal error. Lost connections
// are retried with capped exponential backoff and jitter, resuming at the
// confirmed position; a slot held by another process is waited for.
func (s *Stream) Run(ctx context.Context) error {
	attempt := 0
	var standbySince, standbyLogged time.Time
	for {
		began := time.Now()
		err := s.session(ctx)
		s.connected.Store(false)
		s.standby.Store(CauseOf(err) == CauseSlotInUse)
		if ctx.Err() != nil && err == nil {
			return nil
		}
		var f fatal
		if errors.As(err, &f) || !CauseOf(err).Retryable() {
			return err
		}
		s.h.Lost()
		if ctx.Err() != nil {
			return nil
		}
		wait := retryMin
		switch {
		case CauseOf(err) == CauseSlotInUse:
			// A hot standby: poll often enough to take over within seconds
			// of the active instance's death, log rarely.
			if standbySince.IsZero() {
				standbySince = time.Now()
			}
			if time.Since(standbyLogged) >= standbyLog {
				s.log.Warn("replication slot is in use by another process; waiting to take over", "slot", s.cfg.Slot, "error", err, "waiting", time.Since(standbySince).Round(time.Second))
				standbyLogged = time.Now()
			}
			wait = time.Second
		default:
			standbySince = time.Time{}
			if time.Since(began) > time.Minute {
				attempt = 0 // it streamed a while: this is a new outage
			}
			attempt++
			s.reconnects.Add(1)
			wait = backoff(attempt)
			msg := "replication connection lost; reconnecting"
			var later interface{ Retry() bool }
			var again interface{ Resend() bool }
			if errors.As(err, &later) && later.Retry() {
				// Holding gave the slot up: what it needs is not there yet.
				msg = "the slot was taken, but what streaming needs first is not known yet; trying again"
			} else if errors.As(err, &again) && again.Resend() {
				// The handler gave the connection up: what it was given
				// cannot be handled now (a schema registry that does not
				// answer), or must be read again.
				msg = "giving the replication connection up to read again from the confirmed position"
			}
			s.log.Warn(msg, "error", err, "in", wait.Round(time.Millisecond), "resume_lsn", s.pos.Confirmed())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// backoff is capped exponential with full jitter, so a fleet of streamers
// does not reconnect in lockstep after a server restart.
func backoff(attempt int) time.Duration {
	d := retryMax
	if attempt < 20 {
		d = min(retryMin<<attempt, retryMax)
	}
	return d/2 + rand.N(d/2)
}

// session runs one replication connection from connect to error or
// shutdown.
func (s *Stream) session(ctx context.Context) error {
	// Connecting and starting replication are bounded too: behind a silent
	// network a TCP connect can succeed (a proxy, a load balancer) and the
	// startup message then waits for an answer forever.
	setupCtx := ctx
	if s.cfg.ReceiveTimeout > 0 {
		var cancel context.CancelFunc
		setupCtx, cancel = context.WithTimeout(ctx, s.cfg.ReceiveTimeout)
		defer cancel()
	}
	cfg, err := ParseConfig(s.cfg.URL)
	if err != nil {
		return fatal{fmt.Errorf("postgres url: %w", err)}
	}
	cfg.RuntimeParams["replication"] = "database"
	TextFormats(cfg.RuntimeParams)
	cfg.RuntimeParams["application_name"] = "cdc-outbox"
	pr := &pacedReader{}
	cfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		pr.r = r
		return pgproto3.NewFrontend(pr, w)
	}
	conn, err := pgconn.ConnectConfig(setupCtx, cfg)
	if err != nil {
		return NewConnectError(s.cfg.URL, err)
	}
	defer conn.Close(context.Background())
	if err := s.follow(setupCtx, conn); err != nil {
		return err
	}

	start := s.pos.Confirmed()
	args := []string{
		"proto_version '1'",
		"publication_names '" + strings.ReplaceAll(pgx.Identifier{s.cfg.Publication}.Sanitize(), "'", "''") + "'",
	}
	if v := conn.ParameterStatus("server_version"); serverMajor(v) >= 14 {
		// Logical decoding messages (pg_logical_emit_message) arrive in the
		// stream (protocol version 1 has them from PostgreSQL 14, a
		// transactional one between its transaction's Begin and Commit, a
		// non-transactional one on its own): the outbox prefix's are events,
		// the others are passed over.
		args = append(args, "messages 'true'")
	}
	err = pglogrepl.StartReplication(setupCtx, conn, s.cfg.Slot, start, pglogrepl.StartReplicationOptions{PluginArgs: args})
	if err != nil {
		return s.explain(conn, err)
	}
	held, err := heldSlotPosition(setupCtx, s.cfg.URL, s.cfg.Slot, conn.PID())
	if err != nil {
		return err
	}
	s.tookOver(held)
	if h := s.cfg.Holding; h != nil {
		if err := h(ctx); err != nil {
			var later interface{ Retry() bool }
			if errors.As(err, &later) && later.Retry() {
				return err
			}
			return fatal{err}
		}
	}
	s.standby.Store(false)
	s.connected.Store(true)
	s.log.Info("streaming", "slot", s.cfg.Slot, "publication", s.cfg.Publication, "start_lsn", start)
	// The server resumes after start; what was confirmed before needs no
	// second update, but the first keepalive tick should come soon.
	s.lastSentAt = time.Time{}
	return s.stream(ctx, conn, pr)
}

// tookOver sets what the stream may send from the position of the slot it
// now holds, read after acquiring it. A hot standby's position is the
// slot's as it was when the standby started, possibly hours before it got
// the slot, which the instance before it moved on since; sent as is, it
// would move confirmed_flush_lsn backwards (older PostgreSQL releases take
// what they are told; newer ones ignore it), and a stop before the next
// update would send all of that again.
// Everything up to the slot's position was confirmed by the process that
// held it: the first update says at least that, and the checkpoint, when
// nothing is open or in flight here, starts from it.
func (s *Stream) tookOver(held pglogrepl.LSN) {
	if own := max(s.pos.Confirmed(), s.lastSent); held > own {
		s.log.Info("the slot is ahead of this instance's position: another instance confirmed more while this one waited; resuming from the slot's",
			"slot", s.cfg.Slot, "slot_confirmed_lsn", held, "own_lsn", own)
	}
	s.lastSent = max(s.lastSent, held)
	s.pos.Idle(held)
}

// explain turns the server errors that stop streaming for good into an
// *Error with the facts. conn is the connection that got the error, still
// open unless the error ended it.
func (s *Stream) explain(conn *pgconn.PgConn, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	confirmed := s.pos.Confirmed()
	switch cause := CauseOf(pgErr); {
	case cause == CauseSlotMissing && s.failover != nil:
		return s.slotGoneAfterFailover(err)
	case cause == CauseSlotMissing:
		return &Error{Err: ErrSlotGone, Slot: s.cfg.Slot, Confirmed: confirmed, Cause: err,
			msg: fmt.Sprintf("%v: %v: the slot was dropped while cdc-outbox ran; changes committed after the last confirmed position %s cannot be streamed any more",
				ErrSlotGone, err, confirmed)}
	case cause == CausePublicationMissing:
		return s.publicationGone(err)
	case pgErr.Code == pgerrcode.ObjectNotInPrerequisiteState || pgErr.Code == pgerrcode.UndefinedFile:
		// The slot's own row says whether it was invalidated and why
		// (invalidation_reason, PostgreSQL 17+), whatever language the
		// server speaks; the error's text is the fallback when the
		// connection cannot be asked any more.
		if state, ok := s.slotState(conn); ok && state.Invalidated() {
			return walLostError(s.cfg.Slot, confirmed, state.Reason(), err)
		}
		if cause == CauseWALLost {
			return walLostError(s.cfg.Slot, confirmed, "", err)
		}
	}
	return err
}

// publicationGone is a publication that is missing at the point of the WAL
// being decoded. The server decodes each change with the catalog as it was
// when the change was written, so the changes written while the publication
// was gone cannot be streamed through this slot, even once it is
// re-created.
func (s *Stream) publicationGone(cause error) error {
	return &Error{Err: ErrPublicationGone, Slot: s.cfg.Slot, Publication: s.cfg.Publication, Confirmed: s.pos.Confirmed(),
		msg: fmt.Sprintf("publication %q does not exist at this point of the WAL (PostgreSQL said: %v): it was dropped while the slot still had changes to stream, "+
			"and the server cannot stream past the drop through this slot, even once it is re-created", s.cfg.Publication, cause),
		Cause: cause}
}

// notice acts on a notice the walsender sends while streaming. Since
// PostgreSQL 18, pgoutput meets a publication that does not exist at the
// point of the WAL it decodes with a WARNING (SQLSTATE 55000, `skipped
// loading publication "cdc_outbox"`), where earlier versions stop with an
// error: the changes made while it is gone are then not sent at all, and a
// streamer that went on would confirm past them. So that warning stops the
// stream as the error does. It is told by its SQLSTATE and the
// publication's name, which translations of the message keep. The
// walsender's repeated notice that it waits for a standby slot of
// synchronized_standby_slots is left to the slot monitor. Other notices are
// logged.
func (s *Stream) notice(m *pgproto3.NoticeResponse) error {
	n := pgconn.ErrorResponseToPgError((*pgproto3.ErrorResponse)(m))
	if publicationSkipped(n, s.cfg.Publication) {
		return fatal{s.publicationGone(n)}
	}
	if standbySlotsWait(n) {
		// Repeated every few seconds while it lasts; the slot monitor says
		// it once, with the fix.
		s.log.Debug("PostgreSQL holds the stream back for a standby slot", "message", n.Message, "detail", n.Detail)
		return nil
	}
	s.log.Warn("PostgreSQL sent a notice on the replication connection", "severity", n.Severity, "code", n.Code, "message", n.Message, "detail", n.Detail)
	return nil
}

// slotState reads the slot's row on the replication connection (a
// walsender in database mode runs SQL too), to learn why the server
// refuses to stream from it. ok is false when it cannot be read.
func (s *Stream) slotState(conn *pgconn.PgConn) (info SlotInfo, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The error that ended START_REPLICATION or the stream is followed by
	// ReadyForQuery, which the replication protocol's reader leaves unread.
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return info, false
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			break
		}
	}
	results, err := conn.Exec(ctx, `SELECT coalesce(wal_status, ''), `+slotColumns+
		` FROM pg_replication_slots s WHERE slot_name = `+quoteLiteral(s.cfg.Slot)).ReadAll()
	if err != nil || len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) < 3 {
		return info, false
	}
	row := results[0].Rows[0] // text format
	return SlotInfo{Name: s.cfg.Slot, WALStatus: string(row[0]), InvalidationReason: string(row[1]), Conflicting: string(row[2]) == "t"}, true
}

func serverMajor(version string) int {
	var major int
	_, _ = fmt.Sscanf(version, "%d", &major)
	return major
}

// stream is the receive loop. It never blocks on Kafka: when too much is in
// flight it stops reading but keeps sending status updates, so the server's
// wal_sender_timeout never fires under backpressure.
//
// It also notices a dead connection. Reads wake up every status interval
// and simply read again, and status updates are small writes that the
// kernel buffers, so a connection whose peer went silent (a network
// partition, a firewall that dropped the flow, a hung server) would
// otherwise be read from forever: TCP reports nothing while the kernel
// keeps retransmitting, for up to a quarter of an hour. TCP keepalives or
// tcp_user_timeout would not cover a peer whose kernel still answers (a
// hung server or middlebox), nor be on by default. So the loop keeps its
// own clock: after half of ReceiveTimeout without a message it sends a
// status update that requests a reply, which a live walsender answers at
// once with a keepalive, and after the whole ReceiveTimeout without a
// message it gives the connection up; Run reconnects. Time spent not
// reading (backpressure) does not count as the server's silence.
func (s *Stream) stream(ctx context.Context, conn *pgconn.PgConn, pr *pacedReader) error {
	pr.stream(conn.Conn())
	var deadline time.Time
	heard, probed, received := time.Now(), false, false
	for {
		select {
		case err := <-s.h.Failed():
			return fatal{err}
		default:
		}
		if ctx.Err() != nil {
			return s.shutdown(conn, pr)
		}
		now := time.Now()
		if received {
			heard, probed, received = now, false, false
		}
		if err := s.status(conn, now, false); err != nil {
			return err
		}
		if s.h.Full() {
			if err := s.pause(ctx); err != nil {
				return err
			}
			heard, probed = time.Now(), false
			continue
		}
		switch silence(now, heard, probed, s.cfg.ReceiveTimeout) {
		case silenceProbe:
			if err := s.send(conn, now, true, true); err != nil {
				return err
			}
			probed = true
		case silenceDead:
			return fmt.Errorf("%w: nothing received for %s, a reply requested after %s was not answered",
				ErrServerSilent, now.Sub(heard).Round(time.Millisecond), (s.cfg.ReceiveTimeout / 2).Round(time.Millisecond))
		}
		// Reading blocks until data or the deadline; the deadline is the
		// next moment a status update may be due. Set on the socket rather
		// than through a context, which would cost a goroutine per message.
		if now.After(deadline) {
			deadline = now.Add(s.cfg.StatusInterval)
			if err := pr.setDeadline(deadline); err != nil {
				return err
			}
		}
		// Reads from the socket are paced (pace.go): the reader may let
		// messages gather before a read that starts a new message with
		// nothing buffered.
		pr.fresh = conn.Frontend().ReadBufferLen() == 0
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if isTimeout(err) {
				continue
			}
			return err
		}
		received = true
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.copyData(conn, m.Data); err != nil {
				var f fatal
				if errors.As(err, &f) {
					// A row that cannot be published stops the stream. What
					// came before it is settled first, so the restart after
					// the fix begins at that row's transaction: rows written
					// before a schema change, still unconfirmed, would
					// otherwise meet the configuration made for after it.
					s.settle(conn, pr)
				}
				return err
			}
		case *pgproto3.ErrorResponse:
			return s.explain(conn, pgconn.ErrorResponseToPgError(m))
		case *pgproto3.NoticeResponse:
			if err := s.notice(m); err != nil {
				s.settle(conn, pr) // as for a row that stops the stream
				return err
			}
		case *pgproto3.CopyDone:
			return errors.New("the server ended the replication stream")
		}
	}
}

func (s *Stream) copyData(conn *pgconn.PgConn, data []byte) error {
	if len(data) == 0 {
		return errors.New("empty CopyData message")
	}
	switch data[0] {
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse XLogData: %w", err)
		}
		if err := s.h.WAL(x.WALStart, x.WALData); err != nil {
			var again interface{ Resend() bool }
			if errors.Is(err, ErrCatalog) || errors.As(err, &again) && again.Resend() {
				// Not the row's fault: read it again on a new connection.
				return err
			}
			return fatal{err}
		}
		s.noteReceived(x.ServerWALEnd)
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		s.noteReceived(k.ServerWALEnd)
		// Only when nothing is open or in flight may the server's WAL end
		// become the confirmed position; the checkpoint decides.
		s.pos.Idle(k.ServerWALEnd)
		if k.ReplyRequested {
			return s.status(conn, time.Now(), true)
		}
	}
	return nil
}

func (s *Stream) noteReceived(lsn pglogrepl.LSN) {
	if uint64(lsn) > s.received.Load() {
		s.received.Store(uint64(lsn))
	}
}

// pause waits, without reading, until there is room, the checkpoint moves,
// a status update falls due, or shutdown.
func (s *Stream) pause(ctx context.Context) error {
	t := time.NewTimer(s.cfg.StatusInterval)
	defer t.Stop()
	select {
	case <-s.h.Room():
	case <-s.pos.Wait():
	case <-t.C:
	case <-ctx.Done():
	case err := <-s.h.Failed():
		return fatal{err}
	}
	return nil
}

// status sends a standby status update when nextStatus says one is due.
func (s *Stream) status(conn *pgconn.PgConn, now time.Time, force bool) error {
	return s.send(conn, now, force, false)
}

// send is status; reply also asks the server to answer at once.
func (s *Stream) send(conn *pgconn.PgConn, now time.Time, force, reply bool) error {
	u, due := nextStatus(now, s.pos.Confirmed(), s.lastSent, s.lastSentAt, s.cfg.StatusInterval, s.cfg.KeepaliveInterval, force)
	if !due {
		return nil
	}
	u.ReplyRequested = reply
	if err := pglogrepl.SendStandbyStatusUpdate(context.Background(), conn, u); err != nil {
		return fmt.Errorf("send status update: %w", err)
	}
	s.updates.Add(1)
	if u.WALFlushPosition != s.lastSent {
		s.log.Debug("confirmed", "lsn", u.WALFlushPosition)
	}
	s.lastSent, s.lastSentAt = u.WALFlushPosition, now
	return nil
}

// What silence asks of the receive loop.
const (
	silenceFine  = iota // heard from the server recently enough
	silenceProbe        // request a reply
	silenceDead         // give the connection up
)

// silence decides, from the time the server was last heard from and
// whether a reply was already requested since, whether the connection
// needs a probe or is dead. timeout 0 never decides either.
func silence(now, heard time.Time, probed bool, timeout time.Duration) int {
	if timeout <= 0 {
		return silenceFine
	}
	quiet := now.Sub(heard)
	switch {
	case quiet >= timeout:
		return silenceDead
	case quiet >= timeout/2 && !probed:
		return silenceProbe
	}
	return silenceFine
}

// nextStatus decides whether a standby status update is due and what it
// says. It is due when the confirmed position moved and statusInterval
// passed since the last one, when keepalive passed, or when forced (the
// server asked). It never carries a position below the last one sent. Write,
// flush and apply are all set to the confirmed position explicitly:
// pglogrepl would fill a zero flush or apply position with the write
// position, and the server releases WAL by the flush position.
func nextStatus(now time.Time, confirmed, lastSent pglogrepl.LSN, lastSentAt time.Time,
	statusInterval, keepalive time.Duration, force bool) (pglogrepl.StandbyStatusUpdate, bool) {
	since := now.Sub(lastSentAt)
	if !force && since < keepalive && (confirmed <= lastSent || since < statusInterval) {
		return pglogrepl.StandbyStatusUpdate{}, false
	}
	pos := max(confirmed, lastSent)
	return pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos,
		WALFlushPosition: pos,
		WALApplyPosition: pos,
		ClientTime:       now,
	}, true
}

// shutdown stops reading, waits up to ShutdownTimeout for in-flight records
// while keeping status updates flowing, then sends the final position.
func (s *Stream) shutdown(conn *pgconn.PgConn, pr *pacedReader) error {
	if err := s.drain(conn); err != nil {
		return err
	}
	s.finish(conn, pr)
	s.log.Info("stopped", "confirmed_lsn", s.lastSent)
	return nil
}

// finishTimeout bounds the wait for the server to end the stream: it has
// at most its socket buffers to send first.
const finishTimeout = 10 * time.Second

// finish ends the stream the way the protocol provides, after the final
// status update: CopyDone, then reading (and dropping) what the server
// still sends until it answers with its own CopyDone and is ready for
// queries. The walsender answers only after processing every message sent
// before, so the final position is then stored in the slot.
//
// Closing the connection at once instead loses it at times: the walsender
// is usually still sending, so the client's kernel, closing a socket with
// unread data, resets the connection, and the walsender may exit on the
// reset (or on a failed send) without reading the status update waiting
// in its socket buffer. The next start then resends everything since the
// position confirmed before, and after a row that stopped the stream, it
// meets rows that were already delivered.
//
// The replies are read through pr, unpaced: what the server still sends is
// read as it comes.
func (s *Stream) finish(conn *pgconn.PgConn, pr *pacedReader) {
	pr.fresh = false
	if err := pr.setDeadline(time.Now().Add(finishTimeout)); err != nil {
		return
	}
	if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), conn); err != nil {
		s.log.Warn("could not end the replication stream cleanly; if PostgreSQL did not store the final position, the next start sends again what came after the one before",
			"error", err, "confirmed_lsn", s.lastSent)
	}
}

// drain waits up to ShutdownTimeout for in-flight records while keeping
// status updates flowing, then sends the final position.
func (s *Stream) drain(conn *pgconn.PgConn) error {
	deadline := time.Now().Add(s.cfg.ShutdownTimeout)
	for s.h.InFlight() > 0 && time.Now().Before(deadline) {
		t := time.NewTimer(s.cfg.StatusInterval)
		select {
		case <-s.pos.Wait():
		case <-s.h.Room():
		case <-t.C:
		case err := <-s.h.Failed():
			t.Stop()
			return fatal{err}
		}
		t.Stop()
		if err := s.status(conn, time.Now(), false); err != nil {
			return err
		}
	}
	if n := s.h.InFlight(); n > 0 {
		s.log.Warn("shutdown timeout: records still in flight will be sent again on the next start", "in_flight", n)
	}
	return s.status(conn, time.Now(), true)
}

// settle is drain on the way out with another error: the records before a
// row that stops the stream get their acks and their position confirmed,
// as far as the broker allows within ShutdownTimeout.
func (s *Stream) settle(conn *pgconn.PgConn, pr *pacedReader) {
	if err := s.drain(conn); err != nil {
		s.log.Warn("could not confirm the events before the stopping row; they will be sent again on the next start", "error", err)
		return
	}
	s.finish(conn, pr)
	s.log.Info("confirmed the events before the stopping row", "confirmed_lsn", s.lastSent)
}
