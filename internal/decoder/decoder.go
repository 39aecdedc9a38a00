package decoder

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
)

// Kind says what an Event is.
type Kind uint8

const (
	KindIgnore   Kind = iota // Type and Origin: valid but not needed
	KindBegin                // start of a transaction
	KindInsert               // an insert into the outbox table
	KindCommit               // end of a transaction
	KindRelation             // a Relation message was cached
	KindSkip                 // a change that is not published: see Event.SkipReason
	// KindUnmapped is an Insert into a relation that has no role (see
	// Role): the caller cannot tell whether it is an outbox row, so it must
	// neither publish nor skip it, but treat it as a bad event.
	KindUnmapped
	// KindMessage is a logical decoding message (pg_logical_emit_message)
	// of the outbox prefix (see Messages), transactional or not: the
	// caller decides, as a non-transactional one is no outbox event.
	KindMessage
)

func (k Kind) String() string {
	switch k {
	case KindIgnore:
		return "ignore"
	case KindBegin:
		return "begin"
	case KindInsert:
		return "insert"
	case KindCommit:
		return "commit"
	case KindRelation:
		return "relation"
	case KindSkip:
		return "skip"
	case KindUnmapped:
		return "unmapped"
	case KindMessage:
		return "message"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Values of Event.SkipReason.
const (
	SkipUpdate     = "update"      // an Update of any table
	SkipDelete     = "delete"      // a Delete from any table
	SkipTruncate   = "truncate"    // a Truncate of any tables
	SkipOtherTable = "other_table" // an Insert into a relation whose role is RoleOther
	// SkipOtherPrefix is a logical decoding message whose prefix is not
	// the outbox's: another application's (a heartbeat, a replication
	// tool's marker).
	SkipOtherPrefix = "other_prefix"
)

// Role is what a relation is to the streamer. The decoder does not decide
// it: the caller, which can ask the catalog, assigns it by relation id.
type Role uint8

const (
	// RoleUnmapped: not known to be the outbox nor another table. Every
	// relation starts so; its inserts are KindUnmapped events.
	RoleUnmapped Role = iota
	// RoleOutbox: the outbox table or a partition of it; its inserts are
	// KindInsert events.
	RoleOutbox
	// RoleOther: provably another table; its inserts are skipped
	// (SkipOtherTable).
	RoleOther
)

func (r Role) String() string {
	switch r {
	case RoleUnmapped:
		return "unmapped"
	case RoleOutbox:
		return "outbox"
	case RoleOther:
		return "other"
	}
	return "Role(" + strconv.Itoa(int(r)) + ")"
}

// Value is one column value of a tuple. Data aliases the message passed to
// Decode.
type Value struct {
	Kind byte // 'n' null, 't' text, 'b' binary, 'u' unchanged TOAST; 0 = the relation has no such column
	Data []byte
}

// Missing reports whether the relation has no column of the wanted name.
func (v Value) Missing() bool { return v.Kind == 0 }

// Null reports whether the value is SQL NULL.
func (v Value) Null() bool { return v.Kind == 'n' }

// Column describes one column of a Relation.
type Column struct {
	Name    string
	TypeOID uint32
	Flags   uint8 // 1 = part of the key
	TypeMod int32
}

// Relation is a cached Relation message. The decoder never modifies a
// Relation once cached: a later Relation message for the same id replaces the
// pointer, so a caller may keep a *Relation (but must not modify it).
type Relation struct {
	ID              uint32
	Namespace       string
	Name            string
	ReplicaIdentity uint8
	Columns         []Column
	// Wanted[i] is the index in Columns of the i-th column name given to
	// New, or -1 when the relation has no such column. Computed once when
	// the Relation message arrives, so Insert needs no name lookups.
	Wanted []int
	Role   Role // as assigned for ID when the Relation was cached or since
}

// Event is the result of decoding one message. Which fields are set depends
// on Kind; the others are zero.
type Event struct {
	Kind       Kind
	Xid        uint32        // Begin
	FinalLSN   pglogrepl.LSN // Begin: LSN of the commit record
	CommitTime time.Time     // Begin and Commit, in UTC
	CommitLSN  pglogrepl.LSN // Commit
	EndLSN     pglogrepl.LSN // Commit: end of the commit record (TransactionEndLSN), the position to confirm
	Relation   *Relation     // Insert, Unmapped, Relation, and Skip when the relation is known
	Replaced   *Relation     // Relation: the Relation it replaced, nil when the id was new
	Values     []Value       // Insert, Unmapped: one per wanted column, in New's order (Missing() when the relation lacks it)
	Tuple      []Value       // Insert, Unmapped: every column in relation order (used to dead-letter the raw row)
	SkipReason string        // Skip: one of the Skip* constants

	// Message: whether it was emitted transactionally, the LSN pgoutput
	// gives it (the end of its WAL record), its prefix and content
	// (aliasing the message passed to Decode).
	Transactional bool
	MessageLSN    pglogrepl.LSN
	Prefix        []byte
	Content       []byte
}

// SkipCounts counts the Skip events returned since New, by reason. A Truncate
// message counts once however many tables it names.
type SkipCounts struct {
	Update     uint64
	Delete     uint64
	Truncate   uint64
	OtherTable uint64
	// OtherPrefix counts messages passed over for their prefix.
	OtherPrefix uint64
}

// Decoder decodes the pgoutput messages of one replication stream. It keeps
// the relation cache and reuses one Event, so Decode must be called from one
// goroutine at a time; Skipped may be called from any goroutine.
type Decoder struct {
	wanted []string
	// prefix marks outbox messages (Messages); nil: every message is
	// passed over.
	prefix []byte

	relations map[uint32]*Relation
	roles     map[uint32]Role // assigned by the caller; absent means RoleUnmapped

	// ev, values and tuple are reused by every Decode so that decoding an
	// Insert allocates nothing once tuple has grown to the widest relation.
	ev     Event
	values []Value // backs ev.Values; always len(wanted)
	tuple  []Value // backs ev.Tuple

	// Atomic so a metrics goroutine can read them while Decode runs.
	skipUpdate, skipDelete, skipTruncate, skipOther, skipPrefix atomic.Uint64
}

// New returns a decoder; wanted lists the column names whose values every
// Insert event must carry in Values. Names are compared exactly as
// PostgreSQL sends them (unquoted identifiers are lower case). Which
// relations are the outbox is told with Assign.
func New(wanted []string) *Decoder {
	return &Decoder{
		wanted:    append([]string(nil), wanted...), // the caller's slice may change
		relations: make(map[uint32]*Relation),
		roles:     make(map[uint32]Role),
		values:    make([]Value, len(wanted)),
	}
}

// Assign gives relation id a role, for the Relation cached now and for any
// Relation message of that id later, and returns the cached Relation (nil
// when there is none). The cached Relation is replaced by a copy, never
// modified, so a *Relation held elsewhere keeps its role.
func (d *Decoder) Assign(id uint32, role Role) *Relation {
	d.roles[id] = role
	old := d.relations[id]
	if old == nil || old.Role == role {
		return old
	}
	rel := *old
	rel.Role = role
	d.relations[id] = &rel
	return &rel
}

// Messages makes the logical decoding messages of prefix KindMessage
// events; messages of other prefixes are skipped (SkipOtherPrefix). Without
// it every message is skipped. Call it before the first Decode.
func (d *Decoder) Messages(prefix string) { d.prefix = []byte(prefix) }

// Skipped reports how many changes were skipped since New, by reason.
func (d *Decoder) Skipped() SkipCounts {
	return SkipCounts{
		Update:      d.skipUpdate.Load(),
		Delete:      d.skipDelete.Load(),
		Truncate:    d.skipTruncate.Load(),
		OtherTable:  d.skipOther.Load(),
		OtherPrefix: d.skipPrefix.Load(),
	}
}

// Decode parses one pgoutput message (the WALData of one XLogData). The
// returned *Event and its slices are reused by the next call and alias msg:
// callers copy what they keep. Every error is a *MessageError wrapping one of
// the Err* sentinels; after an error the decoder is unchanged and can go on.
func (d *Decoder) Decode(msg []byte) (*Event, error) {
	if len(msg) == 0 {
		return nil, &MessageError{Detail: "no message type byte", Err: ErrTruncated}
	}
	d.ev = Event{}
	r := reader{msg: msg, off: 1}
	var err error
	switch msg[0] {
	case 'B':
		err = d.begin(&r)
	case 'C':
		err = d.commit(&r)
	case 'R':
		err = d.relation(&r)
	case 'I':
		err = d.insert(&r)
	case 'U':
		err = d.update(&r)
	case 'D':
		err = d.delete(&r)
	case 'T':
		err = d.truncate(&r)
	case 'Y':
		err = ignoreType(&r)
	case 'O':
		err = ignoreOrigin(&r)
	case 'M':
		err = d.message(&r)
	default:
		err = &MessageError{Type: msg[0], Detail: "not a pgoutput protocol version 1 message", Err: ErrUnknownMessageType}
	}
	if err != nil {
		return nil, err
	}
	return &d.ev, nil
}

// Each message handler below reads every field, then calls r.done, and only
// then changes the decoder's state, so a bad message leaves no trace.

func (d *Decoder) begin(r *reader) error {
	final := r.u64("final LSN")
	ts := r.u64("commit timestamp")
	xid := r.u32("xid")
	if err := r.done(); err != nil {
		return err
	}
	d.ev = Event{Kind: KindBegin, Xid: xid, FinalLSN: pglogrepl.LSN(final), CommitTime: pgTime(ts)}
	return nil
}

func (d *Decoder) commit(r *reader) error {
	r.u8("flags") // unused by protocol version 1; not checked so a future flag does not stop the stream
	commitLSN := r.u64("commit LSN")
	endLSN := r.u64("end LSN")
	ts := r.u64("commit timestamp")
	if err := r.done(); err != nil {
		return err
	}
	d.ev = Event{Kind: KindCommit, CommitTime: pgTime(ts), CommitLSN: pglogrepl.LSN(commitLSN), EndLSN: pglogrepl.LSN(endLSN)}
	return nil
}

// minColumnSize is the smallest encoding of a column in a Relation message:
// flags, the NUL of an empty name, type OID and type modifier.
const minColumnSize = 1 + 1 + 4 + 4

func (d *Decoder) relation(r *reader) error {
	id := r.u32("relation id")
	namespace := r.cstring("namespace")
	name := r.cstring("relation name")
	identity := r.u8("replica identity")
	n := int(r.u16("column count"))
	// Checked before allocating so a corrupt count cannot make us allocate
	// room for 65535 columns that are not there.
	if !r.need(n*minColumnSize, "columns") {
		return r.err
	}
	cols := make([]Column, n)
	for i := range cols {
		c := &cols[i]
		c.Flags = r.u8("column flags")
		c.Name = string(r.cstring("column name"))
		c.TypeOID = r.u32("column type OID")
		c.TypeMod = int32(r.u32("column type modifier"))
	}
	if err := r.done(); err != nil {
		return err
	}
	rel := &Relation{
		ID:              id,
		Namespace:       string(namespace),
		Name:            string(name),
		ReplicaIdentity: identity,
		Columns:         cols,
		Wanted:          make([]int, len(d.wanted)),
		Role:            d.roles[id],
	}
	for i, want := range d.wanted {
		rel.Wanted[i] = -1
		for j, c := range cols {
			if c.Name == want {
				rel.Wanted[i] = j
				break
			}
		}
	}
	// Replace rather than update in place: the table may have been altered,
	// and whoever holds the old *Relation keeps a consistent view of it.
	old := d.relations[id]
	d.relations[id] = rel
	d.ev = Event{Kind: KindRelation, Relation: rel, Replaced: old}
	return nil
}

func (d *Decoder) insert(r *reader) error {
	rel, err := d.lookup(r)
	if err != nil {
		return err
	}
	r.expect('N', "new tuple marker")
	tuple := d.readTuple(r, rel)
	if err := r.done(); err != nil {
		return err
	}
	kind := KindInsert
	switch rel.Role {
	case RoleOther:
		d.skip(SkipOtherTable, rel)
		return nil
	case RoleUnmapped:
		// Values too, so that the caller can name the event it cannot
		// publish.
		kind = KindUnmapped
	}
	for i, col := range rel.Wanted {
		if col < 0 {
			d.values[i] = Value{}
		} else {
			d.values[i] = tuple[col]
		}
	}
	d.ev = Event{Kind: kind, Relation: rel, Values: d.values, Tuple: tuple}
	return nil
}

// update and delete read their tuples although they are skipped: checking
// them is what tells us the stream is still in step with the relation cache.
func (d *Decoder) update(r *reader) error {
	rel, err := d.lookup(r)
	if err != nil {
		return err
	}
	// The old tuple is present only when the replica identity asks for it:
	// 'K' for the key columns, 'O' for the whole old row.
	switch marker := r.u8("tuple marker"); marker {
	case 'K', 'O':
		d.readTuple(r, rel)
		r.expect('N', "new tuple marker")
	case 'N':
	default:
		r.fail(r.off-1, fmt.Sprintf("tuple marker is %q, want 'K', 'O' or 'N'", marker), ErrMalformed)
	}
	d.readTuple(r, rel)
	if err := r.done(); err != nil {
		return err
	}
	d.skip(SkipUpdate, rel)
	return nil
}

func (d *Decoder) delete(r *reader) error {
	rel, err := d.lookup(r)
	if err != nil {
		return err
	}
	if marker := r.u8("tuple marker"); r.err == nil && marker != 'K' && marker != 'O' {
		r.fail(r.off-1, fmt.Sprintf("tuple marker is %q, want 'K' or 'O'", marker), ErrMalformed)
	}
	d.readTuple(r, rel)
	if err := r.done(); err != nil {
		return err
	}
	d.skip(SkipDelete, rel)
	return nil
}

func (d *Decoder) truncate(r *reader) error {
	n := r.u32("relation count")
	r.u8("options")
	// Checked up front so a corrupt count cannot keep us looping.
	if r.err == nil && uint64(n) > uint64(len(r.msg)-r.off)/4 {
		r.fail(r.off, fmt.Sprintf("%d relation ids need %d bytes, %d left", n, uint64(n)*4, len(r.msg)-r.off), ErrTruncated)
	}
	// Relation ids are not looked up strictly: a Truncate changes no row we
	// would publish, so an unknown id is no reason to stop the stream. The
	// event names the outbox table if it was truncated, as that is the
	// case worth reporting, else the first known table.
	var rel *Relation
	for range n {
		if r.err != nil {
			break
		}
		if c := d.relations[r.u32("relation id")]; c != nil && (rel == nil || c.Role == RoleOutbox && rel.Role != RoleOutbox) {
			rel = c
		}
	}
	if err := r.done(); err != nil {
		return err
	}
	d.skip(SkipTruncate, rel)
	return nil
}

func ignoreType(r *reader) error {
	r.u32("type OID")
	r.cstring("namespace")
	r.cstring("type name")
	return r.done()
}

func ignoreOrigin(r *reader) error {
	r.u64("origin commit LSN")
	r.cstring("origin name")
	return r.done()
}

// message reads a logical decoding Message. Protocol version 1 has no xid
// in it (that comes with streamed transactions, which are not asked for).
// Flags bit 1 is set for a transactional message; other bits are not
// checked, so that a future flag does not stop the stream.
func (d *Decoder) message(r *reader) error {
	flags := r.u8("flags")
	lsn := r.u64("message LSN")
	prefix := r.cstring("prefix")
	size := int32(r.u32("content length"))
	if size < 0 {
		r.fail(r.off-4, fmt.Sprintf("content length is %d", size), ErrMalformed)
	}
	content := r.take(int(size), "content")
	if err := r.done(); err != nil {
		return err
	}
	if d.prefix == nil || !bytes.Equal(prefix, d.prefix) {
		d.skip(SkipOtherPrefix, nil)
		return nil
	}
	d.ev = Event{Kind: KindMessage, Transactional: flags&1 != 0, MessageLSN: pglogrepl.LSN(lsn), Prefix: prefix, Content: content}
	return nil
}

// lookup reads a change message's relation id and finds its cached Relation.
func (d *Decoder) lookup(r *reader) (*Relation, error) {
	id := r.u32("relation id")
	if r.err != nil {
		return nil, r.err
	}
	rel := d.relations[id]
	if rel == nil {
		return nil, &MessageError{
			Type:   r.msg[0],
			Offset: 1,
			Detail: fmt.Sprintf("relation id %d has not been described by a Relation message", id),
			Err:    ErrUnknownRelation,
		}
	}
	return rel, nil
}

// readTuple reads a TupleData into d.tuple and returns it; nil on error.
func (d *Decoder) readTuple(r *reader, rel *Relation) []Value {
	start := r.off
	n := int(r.u16("tuple column count"))
	if r.err != nil {
		return nil
	}
	if n != len(rel.Columns) {
		r.fail(start, fmt.Sprintf("tuple has %d columns, relation %s.%s has %d", n, rel.Namespace, rel.Name, len(rel.Columns)), ErrMalformed)
		return nil
	}
	d.tuple = d.tuple[:0]
	for range n {
		v := Value{Kind: r.u8("column kind")}
		switch v.Kind {
		case 'n', 'u':
			// No data follows.
		case 't', 'b':
			size := int32(r.u32("column length"))
			if size < 0 {
				r.fail(r.off-4, fmt.Sprintf("column length is %d", size), ErrMalformed)
			}
			v.Data = r.take(int(size), "column value")
		default:
			r.fail(r.off-1, fmt.Sprintf("column kind is %q, want 'n', 'u', 't' or 'b'", v.Kind), ErrMalformed)
		}
		if r.err != nil {
			return nil
		}
		d.tuple = append(d.tuple, v)
	}
	return d.tuple
}

func (d *Decoder) skip(reason string, rel *Relation) {
	switch reason {
	case SkipUpdate:
		d.skipUpdate.Add(1)
	case SkipDelete:
		d.skipDelete.Add(1)
	case SkipTruncate:
		d.skipTruncate.Add(1)
	case SkipOtherTable:
		d.skipOther.Add(1)
	case SkipOtherPrefix:
		d.skipPrefix.Add(1)
	}
	d.ev = Event{Kind: KindSkip, Relation: rel, SkipReason: reason}
}

// pgEpochMicros is 2000-01-01 00:00:00 UTC, the PostgreSQL epoch, in
// microseconds since the Unix epoch.
const pgEpochMicros = 946684800 * 1_000_000

// pgTime converts a pgoutput timestamp (microseconds since the PostgreSQL
// epoch) to a time.Time in UTC.
func pgTime(us uint64) time.Time {
	return time.UnixMicro(int64(us) + pgEpochMicros).UTC()
}

// reader reads big-endian fields from one message. Its error is sticky: after
// the first failure every read returns zero values, so a handler can read all
// its fields and check once, and the error reports the first problem.
type reader struct {
	msg []byte // the whole message; msg[0] is its type
	off int    // next byte to read
	err error  // first failure, a *MessageError
}

// fail records the first failure; later ones are consequences of it.
func (r *reader) fail(off int, detail string, err error) {
	if r.err == nil {
		r.err = &MessageError{Type: r.msg[0], Offset: off, Detail: detail, Err: err}
	}
}

// need reports whether n more bytes are available, recording a failure when
// they are not.
func (r *reader) need(n int, field string) bool {
	if r.err == nil && n <= len(r.msg)-r.off {
		return true
	}
	r.short(n, field)
	return false
}

// short records that field needed n bytes. It is separate from need so that
// need is small enough to be inlined: formatting the error is the cold path.
func (r *reader) short(n int, field string) {
	if r.err == nil {
		left := len(r.msg) - r.off
		r.fail(r.off, fmt.Sprintf("%s needs %d bytes, %d left", field, n, left), ErrTruncated)
	}
}

// take returns the next n bytes, capped so that appending to them cannot
// overwrite the rest of the message.
func (r *reader) take(n int, field string) []byte {
	if !r.need(n, field) {
		return nil
	}
	b := r.msg[r.off : r.off+n : r.off+n]
	r.off += n
	return b
}

func (r *reader) u8(field string) byte {
	if b := r.take(1, field); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16(field string) uint16 {
	if b := r.take(2, field); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32(field string) uint32 {
	if b := r.take(4, field); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64(field string) uint64 {
	if b := r.take(8, field); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

// expect reads one byte that must be want.
func (r *reader) expect(want byte, field string) {
	if got := r.u8(field); r.err == nil && got != want {
		r.fail(r.off-1, fmt.Sprintf("%s is %q, want %q", field, got, want), ErrMalformed)
	}
}

// cstring reads a NUL-terminated string, without the NUL.
func (r *reader) cstring(field string) []byte {
	if r.err != nil {
		return nil
	}
	n := bytes.IndexByte(r.msg[r.off:], 0)
	if n < 0 {
		r.fail(r.off, field+" has no terminating NUL", ErrTruncated)
		return nil
	}
	s := r.msg[r.off : r.off+n : r.off+n]
	r.off += n + 1
	return s
}

// done checks that the whole message was read and returns the first failure.
func (r *reader) done() error {
	if r.err == nil && r.off != len(r.msg) {
		r.fail(r.off, fmt.Sprintf("%d bytes left after the last field", len(r.msg)-r.off), ErrMalformed)
	}
	return r.err
}
