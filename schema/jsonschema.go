package schema

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// jsonSchemaCodec validates JSON payloads against one JSON Schema; the
// payload goes out unchanged after the wire header. A schema without
// "$schema" is read as draft-07, the draft Confluent's registry and
// serializers assume. A "$ref" is resolved within the schema only: nothing
// is loaded from files or the network.
type jsonSchemaCodec struct {
	schema *jsonschema.Schema
}

const jsonSchemaURL = "mem:///schema.json"

func compileJSONSchema(text string) (*jsonSchemaCodec, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.UseLoader(noLoader{})
	if err := c.AddResource(jsonSchemaURL, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(jsonSchemaURL)
	if err != nil {
		return nil, err
	}
	return &jsonSchemaCodec{schema: s}, nil
}

type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s: a schema from the registry may refer only within itself", url)
}

var english = message.NewPrinter(language.English)

func (c *jsonSchemaCodec) validate(payload []byte) *mismatch {
	// decodeJSON reads the payload as the validator's own
	// jsonschema.UnmarshalJSON does (numbers as json.Number, objects as
	// map[string]any), so its value is the instance: the payload is
	// parsed once.
	inst, m := decodeJSON(payload)
	if m != nil {
		return m
	}
	err := c.schema.Validate(inst)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return &mismatch{"$", err.Error()}
	}
	// The first leaf of the tree of causes is the first mismatch.
	for len(ve.Causes) > 0 {
		ve = ve.Causes[0]
	}
	return &mismatch{instancePath(inst, ve.InstanceLocation), ve.ErrorKind.LocalizedString(english)}
}

// instancePath writes an instance location as a JSON path, telling array
// indexes from object keys by the instance itself.
func instancePath(inst any, loc []string) string {
	path := "$"
	for _, tok := range loc {
		switch v := inst.(type) {
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return field(path, tok)
			}
			path, inst = element(path, i), v[i]
		case map[string]any:
			path, inst = field(path, tok), v[tok]
		default:
			return field(path, tok)
		}
	}
	return path
}
