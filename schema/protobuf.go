package schema

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// protoCodec encodes JSON payloads by the messages of one .proto file,
// compiled from the registry's text at run time (protocompile; the
// well-known types of google/protobuf may be imported). The payload is read
// by protojson, the canonical JSON mapping of Protobuf (field names in
// lowerCamelCase or as declared; 64-bit integers as numbers or strings;
// enums by name or number; bytes in base64; Timestamp and Duration as
// strings), strictly: a member that is no field of the message is a
// mismatch. The message is the first of the file unless one is named.
type protoCodec struct {
	file     protoreflect.FileDescriptor
	messages []protoreflect.MessageDescriptor // every message, nested ones too, in declaration order
}

// protoFile is the name the schema's text is compiled under; only its
// errors show it.
const protoFile = "schema.proto"

func compileProtobuf(ctx context.Context, text string) (*protoCodec, error) {
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{protoFile: text}),
		}),
		MaxParallelism: 1,
	}
	files, err := c.Compile(ctx, protoFile)
	if err != nil {
		return nil, err
	}
	fd := files[0]
	if fd.Messages().Len() == 0 {
		return nil, errors.New("the file declares no message")
	}
	pc := &protoCodec{file: fd}
	var walk func(ms protoreflect.MessageDescriptors)
	walk = func(ms protoreflect.MessageDescriptors) {
		for i := 0; i < ms.Len(); i++ {
			if ms.Get(i).IsMapEntry() {
				continue
			}
			pc.messages = append(pc.messages, ms.Get(i))
			walk(ms.Get(i).Messages())
		}
	}
	walk(fd.Messages())
	return pc, nil
}

// message finds the message named name: its full name, or its name
// within the file's package, or (when only one has it) its short name.
// An empty name is the file's first message.
func (c *protoCodec) message(name string) (protoreflect.MessageDescriptor, error) {
	if name == "" {
		return c.file.Messages().Get(0), nil
	}
	var short []protoreflect.MessageDescriptor
	for _, md := range c.messages {
		full := string(md.FullName())
		if full == name || strings.TrimPrefix(full, string(c.file.Package())+".") == name {
			return md, nil
		}
		if string(md.Name()) == name {
			short = append(short, md)
		}
	}
	if len(short) == 1 {
		return short[0], nil
	}
	names := make([]string, len(c.messages))
	for i, md := range c.messages {
		names[i] = string(md.FullName())
	}
	if len(short) > 1 {
		return nil, fmt.Errorf("message %q is ambiguous in the schema: name it in full (%s)", name, strings.Join(names, ", "))
	}
	return nil, fmt.Errorf("no message %q in the schema (it has %s)", name, strings.Join(names, ", "))
}

// messageIndex is the message's path in the file, as the wire format's
// message indexes give it: its index among the file's top-level messages,
// then among each nested level's.
func messageIndex(md protoreflect.MessageDescriptor) []int {
	var index []int
	for d := protoreflect.Descriptor(md); ; d = d.Parent() {
		if _, ok := d.(protoreflect.FileDescriptor); ok || d == nil {
			break
		}
		index = append([]int{d.Index()}, index...)
	}
	return index
}

func (c *protoCodec) encode(payload []byte, md protoreflect.MessageDescriptor) ([]byte, []int, *mismatch) {
	msg := dynamicpb.NewMessage(md)
	if err := protojson.Unmarshal(payload, msg); err != nil {
		if _, m := decodeJSON(payload); m != nil {
			return nil, nil, m
		}
		return nil, nil, locateProto(md, payload, "$", err)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		// Required fields of proto2 missing, which protojson lets pass.
		return nil, nil, &mismatch{"$", protoReason(err)}
	}
	return b, messageIndex(md), nil
}

// locateProto finds where in raw (JSON read as message md at path) protojson
// fails: it tries each member alone and descends into the first that fails,
// so protojson itself stays the judge of what fits and the error gains the
// path it lacks. err is protojson's error for the whole, the reason when no
// member is found at fault.
func locateProto(md protoreflect.MessageDescriptor, raw []byte, path string, err error) *mismatch {
	if strings.HasPrefix(string(md.FullName()), "google.protobuf.") {
		return &mismatch{path, protoReason(err)} // well-known types have JSON forms of their own
	}
	members, ok := jsonMembers(raw)
	if !ok {
		var v any
		_ = json.Unmarshal(raw, &v)
		return &mismatch{path, fmt.Sprintf("want an object (message %s), got %s", md.FullName(), jsonKind(v))}
	}
	for _, mem := range members {
		p := field(path, mem.key)
		fd := md.Fields().ByJSONName(mem.key)
		if fd == nil {
			fd = md.Fields().ByName(protoreflect.Name(mem.key))
		}
		if fd == nil {
			return &mismatch{p, fmt.Sprintf("no field %q in message %s", mem.key, md.FullName())}
		}
		one, _ := json.Marshal(map[string]json.RawMessage{mem.key: mem.value})
		err := protojson.Unmarshal(one, dynamicpb.NewMessage(md))
		if err == nil {
			continue
		}
		switch {
		case fd.IsList():
			var items []json.RawMessage
			if json.Unmarshal(mem.value, &items) != nil {
				return &mismatch{p, protoReason(err)}
			}
			for i, item := range items {
				one, _ := json.Marshal(map[string][]json.RawMessage{mem.key: {item}})
				if ierr := protojson.Unmarshal(one, dynamicpb.NewMessage(md)); ierr != nil {
					if fd.Message() != nil {
						return locateProto(fd.Message(), item, element(p, i), ierr)
					}
					return &mismatch{element(p, i), protoReason(ierr)}
				}
			}
		case fd.IsMap():
			entries, ok := jsonMembers(mem.value)
			if !ok {
				return &mismatch{p, protoReason(err)}
			}
			for _, e := range entries {
				one, _ := json.Marshal(map[string]map[string]json.RawMessage{mem.key: {e.key: e.value}})
				if ierr := protojson.Unmarshal(one, dynamicpb.NewMessage(md)); ierr != nil {
					if v := fd.MapValue(); v.Message() != nil {
						return locateProto(v.Message(), e.value, field(p, e.key), ierr)
					}
					return &mismatch{field(p, e.key), protoReason(ierr)}
				}
			}
		case fd.Message() != nil:
			return locateProto(fd.Message(), mem.value, p, err)
		}
		return &mismatch{p, protoReason(err)}
	}
	return &mismatch{path, protoReason(err)}
}

type jsonMember struct {
	key   string
	value json.RawMessage
}

// jsonMembers reads a JSON object's members in their order in the text.
func jsonMembers(raw []byte) ([]jsonMember, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	var members []jsonMember
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		members = append(members, jsonMember{t.(string), v})
	}
	if _, err := dec.Token(); err != nil && !errors.Is(err, io.EOF) {
		return nil, false
	}
	return members, true
}

// protoPrefix is what protojson puts before its reason: "proto:" (with a
// space it randomly makes a non-breaking one, so that no one matches its
// text) and a position in the text, which the path replaces.
var protoPrefix = regexp.MustCompile(`^proto:[\s\x{00a0}]*(\(line \d+:\d+\):[\s\x{00a0}]*)?`)

func protoReason(err error) string {
	return strings.ReplaceAll(protoPrefix.ReplaceAllString(err.Error(), ""), "\u00a0", " ")
}
