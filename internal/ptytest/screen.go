package ptytest

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Screen is what a terminal cols wide shows once out was written to it, as lines (trailing spaces
// and empty lines trimmed): text overwrites what is under the cursor and wraps at the last column,
// CR and LF move the cursor, and so do the sequences that redraw lines in place (ESC[nA up, ESC[nB
// down, ESC[nG column, ESC[J erase below, ESC[K erase in line). Other escape sequences are dropped,
// and every character is taken as one column wide. It lets a test check what a user is left
// looking at, not only which bytes went by.
func Screen(out []byte, cols int) []string {
	var lines [][]rune
	row, col := 0, 0
	at := func(r int) []rune {
		for len(lines) <= r {
			lines = append(lines, nil)
		}
		return lines[r]
	}
	for i := 0; i < len(out); {
		c := out[i]
		switch {
		case c == '\r':
			col = 0
			i++
		case c == '\n':
			row++
			i++
		case c == '\b':
			col = max(col-1, 0)
			i++
		case c == 0x1b && i+1 < len(out) && out[i+1] == '[':
			j := i + 2
			for j < len(out) && (out[j] < 0x40 || out[j] > 0x7e) {
				j++
			}
			if j == len(out) {
				return trim(lines)
			}
			n, err := strconv.Atoi(string(out[i+2 : j]))
			if err != nil {
				n = 0
			}
			switch out[j] {
			case 'A':
				row = max(row-max(n, 1), 0)
			case 'B':
				row += max(n, 1)
			case 'G':
				col = max(n, 1) - 1
			case 'J':
				if n == 0 {
					l := at(row)
					lines[row] = l[:min(col, len(l))]
					lines = lines[:row+1]
				}
			case 'K':
				if n == 0 {
					l := at(row)
					lines[row] = l[:min(col, len(l))]
				}
			}
			i = j + 1
		case c == 0x1b:
			i += 2 // ESC and one byte
		case c < 0x20 || c == 0x7f:
			i++
		default:
			r, size := utf8.DecodeRune(out[i:])
			i += size
			if col >= cols {
				row, col = row+1, 0
			}
			l := at(row)
			for len(l) <= col {
				l = append(l, ' ')
			}
			l[col] = r
			lines[row] = l
			col++
		}
	}
	return trim(lines)
}

func trim(lines [][]rune) []string {
	var s []string
	for _, l := range lines {
		s = append(s, strings.TrimRight(string(l), " "))
	}
	for len(s) > 0 && s[len(s)-1] == "" {
		s = s[:len(s)-1]
	}
	return s
}
