package schema

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// RegistryConfig says where the registry is and how to reach it.
type RegistryConfig struct {
	// URL is the base URL of the Confluent-compatible REST API (Apicurio
	// serves it under /apis/ccompat/v7).
	URL string
	// Username and Password: HTTP basic authentication, when Username is
	// set.
	Username, Password string
	// BearerToken: an Authorization: Bearer token, when set. Not together
	// with basic authentication.
	BearerToken string
	// CAFile: PEM certificates of the authorities that sign the registry's
	// certificate, for an https URL; the system's when empty.
	CAFile string
	// Timeout bounds each request; 10 s when zero. A registry slower than
	// that is a *RegistryError with no status.
	Timeout time.Duration
	// Observer is told of every request; nil for none.
	Observer Observer
}

// Observer is told of every request the Registry makes, so that a caller
// can count and time them (the "once per schema, not per event" of the
// caches is a count of these).
type Observer interface {
	// RegistryCall: op is one of OpSchemaByID, OpSubjectVersion,
	// OpLatestVersion, OpRegister; err is nil on success.
	RegistryCall(op string, elapsed time.Duration, err error)
}

// The requests a Registry makes, as its Observer and its errors name them.
const (
	OpSchemaByID     = "schema_by_id"
	OpSubjectVersion = "subject_version"
	OpLatestVersion  = "latest_version"
	OpRegister       = "register"
)

// Schema is a schema of the registry as the encoders use it.
type Schema struct {
	ID      int
	Subject string // "" when it was chosen by id
	Version int    // 0 when it was chosen by id
	Format  Format
}

// Registry fetches schemas from a registry through franz-go's sr.Client
// and keeps them: a schema by id for good (ids are immutable, so it is
// compiled once), a subject's version's id for good (a version's schema
// does not change; a deleted version is noticed when a new id is needed),
// a subject's latest version for as long as its caller says. It is safe
// for concurrent use; two callers missing the same entry at once may both
// fetch it.
type Registry struct {
	url      string
	client   *sr.Client
	timeout  time.Duration
	observer Observer
	now      func() time.Time

	mu      sync.Mutex
	byID    map[int]*compiled
	version map[subjectVersion]int
	latest  map[string]latestEntry
}

type subjectVersion struct {
	subject string
	version int
}

type latestEntry struct {
	id, version int
	fetched     time.Time
}

// compiled is a schema's text compiled for its format, or why it cannot be.
type compiled struct {
	format Format
	avro   *avroCodec
	proto  *protoCodec
	json   *jsonSchemaCodec
	err    error // a *SchemaError: the text is no usable schema
}

// NewRegistry checks the configuration and makes the client; it makes no
// request.
func NewRegistry(cfg RegistryConfig) (*Registry, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("schema registry URL %q is not an http or https URL", cfg.URL)
	}
	if cfg.Username != "" && cfg.BearerToken != "" {
		return nil, errors.New("schema registry: basic authentication and a bearer token are exclusive")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("schema registry CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("schema registry CA file %s holds no PEM certificate", cfg.CAFile)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	opts := []sr.ClientOpt{
		sr.URLs(strings.TrimRight(cfg.URL, "/")),
		sr.HTTPClient(&http.Client{Transport: transport}),
		sr.UserAgent("cdc-outbox"),
	}
	if cfg.Username != "" {
		opts = append(opts, sr.BasicAuth(cfg.Username, cfg.Password))
	}
	if cfg.BearerToken != "" {
		opts = append(opts, sr.BearerToken(cfg.BearerToken))
	}
	client, err := sr.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	return &Registry{
		url:      strings.TrimRight(cfg.URL, "/"),
		client:   client,
		timeout:  cfg.Timeout,
		observer: cfg.Observer,
		now:      time.Now,
		byID:     map[int]*compiled{},
		version:  map[subjectVersion]int{},
		latest:   map[string]latestEntry{},
	}, nil
}

// URL is the registry's base URL.
func (r *Registry) URL() string { return r.url }

// call runs one request with the timeout, tells the observer, and turns a
// failure into a *NotFoundError (the registry's own "not found" codes) or a
// *RegistryError (anything else).
func (r *Registry) call(ctx context.Context, op, path string, notFound NotFoundError, do func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	start := time.Now()
	err := do(ctx)
	if r.observer != nil {
		r.observer.RegistryCall(op, time.Since(start), err)
	}
	if err == nil {
		return nil
	}
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch re.ErrorCode {
		case 40401, 40402, 40403:
			if re.StatusCode == http.StatusNotFound {
				notFound.URL, notFound.Code = r.url, re.ErrorCode
				return &notFound
			}
		}
		return &RegistryError{URL: re.URL, Op: op, Status: re.StatusCode, Code: re.ErrorCode, Err: errors.New(strings.TrimSpace(re.Error()))}
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		err = fmt.Errorf("no answer within %s: %w", r.timeout, err)
	}
	return &RegistryError{URL: r.url + path, Op: op, Err: err}
}

// schemaByID returns the schema with the global id, fetched and compiled
// once.
func (r *Registry) schemaByID(ctx context.Context, id int) (*compiled, error) {
	r.mu.Lock()
	c, ok := r.byID[id]
	r.mu.Unlock()
	if ok {
		return c, nil
	}
	var s sr.Schema
	err := r.call(ctx, OpSchemaByID, fmt.Sprintf("/schemas/ids/%d", id), NotFoundError{ID: id}, func(ctx context.Context) (err error) {
		s, err = r.client.SchemaByID(ctx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	c = compile(id, s)
	r.mu.Lock()
	r.byID[id] = c
	r.mu.Unlock()
	return c, nil
}

// versionID returns the id of a subject's version, asked once.
func (r *Registry) versionID(ctx context.Context, subject string, version int) (int, error) {
	key := subjectVersion{subject, version}
	r.mu.Lock()
	id, ok := r.version[key]
	r.mu.Unlock()
	if ok {
		return id, nil
	}
	ss, err := r.subjectVersion(ctx, OpSubjectVersion, subject, version)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.version[key] = ss.ID
	r.mu.Unlock()
	return ss.ID, nil
}

// latestID returns the id and version of a subject's latest version, asked
// again once what it has is older than maxAge.
func (r *Registry) latestID(ctx context.Context, subject string, maxAge time.Duration) (id, version int, err error) {
	r.mu.Lock()
	e, ok := r.latest[subject]
	r.mu.Unlock()
	if ok && r.now().Sub(e.fetched) < maxAge {
		return e.id, e.version, nil
	}
	ss, err := r.subjectVersion(ctx, OpLatestVersion, subject, -1)
	if err != nil {
		return 0, 0, err
	}
	r.mu.Lock()
	r.latest[subject] = latestEntry{id: ss.ID, version: ss.Version, fetched: r.now()}
	r.version[subjectVersion{subject, ss.Version}] = ss.ID
	r.mu.Unlock()
	return ss.ID, ss.Version, nil
}

// subjectVersion asks for a subject's version (-1: the latest) and keeps
// the schema it comes with, so that its id is not asked for again.
func (r *Registry) subjectVersion(ctx context.Context, op, subject string, version int) (sr.SubjectSchema, error) {
	v := fmt.Sprint(version)
	nf := NotFoundError{Subject: subject, Version: version}
	if version == -1 {
		v, nf.Version = "latest", 0
	}
	var ss sr.SubjectSchema
	err := r.call(ctx, op, "/subjects/"+url.PathEscape(subject)+"/versions/"+v, nf, func(ctx context.Context) (err error) {
		ss, err = r.client.SchemaByVersion(ctx, subject, version)
		return err
	})
	if err != nil {
		return ss, err
	}
	r.mu.Lock()
	_, known := r.byID[ss.ID]
	r.mu.Unlock()
	if !known {
		c := compile(ss.ID, ss.Schema)
		r.mu.Lock()
		r.byID[ss.ID] = c
		r.mu.Unlock()
	}
	return ss, nil
}

// Register registers text as a schema of the format under subject (or
// finds it there, if it is already) and returns its id and version. It is
// the one request that changes the registry; nothing calls it unless asked.
func (r *Registry) Register(ctx context.Context, subject string, format Format, text string) (Schema, error) {
	s := sr.Schema{Schema: text, Type: srType(format)}
	var ss sr.SubjectSchema
	err := r.call(ctx, OpRegister, "/subjects/"+url.PathEscape(subject)+"/versions", NotFoundError{Subject: subject}, func(ctx context.Context) (err error) {
		ss, err = r.client.CreateSchema(ctx, subject, s)
		return err
	})
	if err != nil {
		return Schema{}, err
	}
	return Schema{ID: ss.ID, Subject: subject, Version: ss.Version, Format: format}, nil
}

// RegisterFile registers the schema in the file at path (see Register).
func (r *Registry) RegisterFile(ctx context.Context, subject string, format Format, path string) (Schema, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Schema{}, err
	}
	return r.Register(ctx, subject, format, string(b))
}

func srType(f Format) sr.SchemaType {
	switch f {
	case Protobuf:
		return sr.TypeProtobuf
	case JSONSchema:
		return sr.TypeJSON
	}
	return sr.TypeAvro
}

func formatOf(t sr.SchemaType) Format {
	switch t {
	case sr.TypeProtobuf:
		return Protobuf
	case sr.TypeJSON:
		return JSONSchema
	}
	return Avro
}

// compile compiles a schema's text by its type. A schema that cannot be
// used is kept as such (its id will not change), so it is not fetched
// again for every event. No caller's context bounds it: it is work on
// the text alone, and a result cut short would be kept.
func compile(id int, s sr.Schema) *compiled {
	c := &compiled{format: formatOf(s.Type)}
	if len(s.References) > 0 {
		c.err = &SchemaError{ID: id, Format: c.format, Err: fmt.Errorf("it refers to %d other schema(s); references are not supported", len(s.References))}
		return c
	}
	var err error
	switch c.format {
	case Avro:
		c.avro, err = compileAvro(s.Schema)
	case Protobuf:
		c.proto, err = compileProtobuf(context.Background(), s.Schema)
	case JSONSchema:
		c.json, err = compileJSONSchema(s.Schema)
	}
	if err != nil {
		c.err = &SchemaError{ID: id, Format: c.format, Err: err}
	}
	return c
}
