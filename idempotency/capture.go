package idempotency

import (
	"bytes"
	"net/http"
)

// recorder buffers the handler's response: nothing may reach the client
// before the transaction that makes it true has committed, and the same
// bytes are what the key stores. Flushing, hijacking and trailers are not
// supported, by design.
type recorder struct {
	header http.Header // what the handler edits
	sent   http.Header // header as of WriteHeader, like net/http
	code   int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: make(http.Header)} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.code != 0 || code < 200 { // only the first final status counts; 1xx is not one
		return
	}
	r.code = code
	r.sent = r.header.Clone()
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.WriteHeader(http.StatusOK)
	}
	return r.body.Write(b)
}

// result is the complete response, as net/http would have sent it: 200 when
// the handler wrote nothing, Content-Type sniffed when the handler set
// none, so a replay is byte for byte what the first client received.
func (r *recorder) result() stored {
	if r.code == 0 {
		r.WriteHeader(http.StatusOK)
	}
	h := r.sent
	if _, set := h["Content-Type"]; !set && r.body.Len() > 0 && h.Get("Content-Encoding") == "" {
		h.Set("Content-Type", http.DetectContentType(r.body.Bytes()))
	}
	return stored{code: r.code, headers: h, body: r.body.Bytes()}
}

// keep returns the headers of h worth storing: only those listed, since
// others (Date, Set-Cookie, tracing ids, ...) describe the first response
// only.
func keep(h http.Header, names []string) http.Header {
	out := http.Header{}
	for _, n := range names {
		if v, ok := h[n]; ok {
			out[n] = v
		}
	}
	return out
}

// write sends resp to the client with all of resp.headers.
func write(w http.ResponseWriter, resp stored) {
	for k, v := range resp.headers {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.code)
	_, _ = w.Write(resp.body)
}
