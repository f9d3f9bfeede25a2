package app

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

// slowRequest opens a connection to in and sends the headers of a filter
// request announcing a body of contentLength bytes, then body (maybe nothing).
func slowRequest(t *testing.T, in *instance, contentLength int, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(in.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	head := fmt.Sprintf("POST /gpushare-scheduler/filter HTTP/1.1\r\nHost: extender\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", contentLength, body)
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	return conn
}

// readingBodies counts the handlers waiting in readBody for a body to arrive.
func readingBodies() int {
	buf := make([]byte, 8<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	return strings.Count(stacks, "extender/server.readBody(")
}

func heapInuse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestSlowConnectionsHeapBounded: 50 connections each announce a 60 MiB
// filter body (under the limit set here, the old default 64 MiB) and send
// nothing or a few bytes. Before, each handler allocated the announced size
// at once (3 GiB in all); now the buffers grow with what arrives, so the
// heap stays within a few MiB, and a normal filter request still answers 200
// meanwhile.
func TestSlowConnectionsHeapBounded(t *testing.T) {
	const conns, announced = 50, 60 << 20
	in := start(t, Config{Client: fake.NewClientset(gpuNode("n1", 32, 2)), MaxBodyBytes: 64 << 20})
	in.eventually("ready", in.ready)
	before := heapInuse()
	for i := range conns {
		body := ""
		if i%2 == 1 {
			body = `{"Pod":{"metadata":` // a few bytes, then nothing more
		}
		slowRequest(t, in, announced, body)
	}
	// Every handler has started reading its body, so the old code would have
	// allocated its buffer by now.
	in.eventually(fmt.Sprintf("%d handlers reading their bodies", conns), func() bool { return readingBodies() >= conns })
	after := heapInuse()
	grown := int64(after) - int64(before)
	t.Logf("heap in use: %.1f MiB before, %.1f MiB with %d connections announcing %d MiB each (grown %.1f MiB)",
		float64(before)/(1<<20), float64(after)/(1<<20), conns, announced>>20, float64(grown)/(1<<20))
	if grown > 32<<20 {
		t.Errorf("heap grew by %.1f MiB with %d idle connections; want under 32 MiB", float64(grown)/(1<<20), conns)
	}
	start := time.Now()
	if code, body := in.do("POST", "/gpushare-scheduler/filter", filterArgs); code != http.StatusOK {
		t.Errorf("filter beside %d slow connections = %d %s", conns, code, body)
	}
	t.Logf("filter answered in %v beside them", time.Since(start))
}

// TestSlowAndIdleConnectionsClosed: a connection that sends a body too
// slowly, one that sends no request at all and one kept alive after a
// request are closed by the server after ReadTimeout, the header timeout
// and IdleTimeout (shortened here): each sees EOF well before its read
// deadline.
func TestSlowAndIdleConnectionsClosed(t *testing.T) {
	const timeout = 300 * time.Millisecond
	in := start(t, Config{Client: fake.NewClientset(gpuNode("n1", 32, 2)), ReadTimeout: timeout, IdleTimeout: timeout})
	in.eventually("ready", in.ready)
	addr := strings.TrimPrefix(in.url, "http://")

	// closed reads r until EOF under a 10s deadline: the server must close first.
	closed := func(what string, conn net.Conn, r io.Reader, since time.Time) {
		t.Helper()
		if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		rest, err := io.ReadAll(r)
		if err != nil {
			t.Errorf("%s: still open (%v) after %v; want the server to close it", what, err, time.Since(since))
			return
		}
		t.Logf("%s: closed by the server after %v (sent %q)", what, time.Since(since).Round(time.Millisecond), firstLine(rest))
	}

	t0 := time.Now()
	slow := slowRequest(t, in, 60<<10, `{"Pod":`)
	closed("slow body", slow, slow, t0)

	t0 = time.Now()
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	closed("no request", silent, silent, t0)

	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: extender\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(idle)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("healthz on a kept-alive connection: %d close=%v %v", resp.StatusCode, resp.Close, err)
	}
	resp.Body.Close()
	closed("idle keep-alive", idle, br, time.Now())
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\r\n")
	return s
}
