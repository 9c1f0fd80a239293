// portserver is the server TestE2BPorts runs in a Bench (the Bench's Workshop has no python): on the
// port it is given it answers HTTP with what it was sent (method, path, Host, whether a traffic token
// reached it) and echoes a WebSocket's text messages. Only the standard library's net: small enough
// to upload through the SDK.
package main

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"os"
	"strings"
)

func main() {
	ln, err := net.Listen("tcp", "0.0.0.0:"+os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(1)
		}
		go serve(c)
	}
}

func serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	tp := textproto.NewReader(br)
	line, err := tp.ReadLine()
	if err != nil {
		return
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil {
		return
	}
	method, rest, _ := strings.Cut(line, " ")
	path, _, _ := strings.Cut(rest, " ")
	if strings.EqualFold(h.Get("Upgrade"), "websocket") {
		sum := sha1.Sum([]byte(h.Get("Sec-Websocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", base64.StdEncoding.EncodeToString(sum[:]))
		echo(br, c)
		return
	}
	body := fmt.Sprintf("%s %s host=%s token=%v port=%s\n", method, path, h.Get("Host"), h.Get("E2b-Traffic-Access-Token") != "", os.Args[1])
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// echo answers each text frame (masked, from the client; at most 64 KiB) with "echo: " and its text,
// until a close frame.
func echo(r *bufio.Reader, w io.Writer) {
	for {
		var hdr [2]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		op, n := hdr[0]&0x0f, uint64(hdr[1]&0x7f)
		switch n {
		case 126:
			var b [2]byte
			io.ReadFull(r, b[:])
			n = uint64(binary.BigEndian.Uint16(b[:]))
		case 127:
			return
		}
		var mask [4]byte
		if hdr[1]&0x80 != 0 {
			io.ReadFull(r, mask[:])
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return
		}
		for i := range payload {
			payload[i] ^= mask[i%4]
		}
		if op == 8 {
			w.Write([]byte{0x88, 0})
			return
		}
		out := append([]byte("echo: "), payload...)
		frame := []byte{0x81}
		if len(out) < 126 {
			frame = append(frame, byte(len(out)))
		} else {
			frame = append(frame, 126, byte(len(out)>>8), byte(len(out)))
		}
		w.Write(append(frame, out...))
	}
}
