package recipe

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// SetArray returns data with the string array table.key set to values, changing nothing else: the
// recipe a human wrote keeps its comments, order and layout, so that a proposal's diff shows only what
// changed. A missing key is added under its table (the table at the end if it is missing too).
func SetArray(data []byte, table, key string, values []string) ([]byte, error) {
	doc, perr := decode(data)
	if perr != nil {
		return nil, fmt.Errorf("%s", perr.Msg)
	}
	tf := field{}.key(table)
	if off := doc.offset(tf.key(key)); off >= 0 {
		lb, rb, err := arraySpan(data, off)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %v", table, key, err)
		}
		multi := bytes.IndexByte(data[lb:rb], '\n') >= 0
		return concat(data[:lb], formatArray(values, multi), data[rb:]), nil
	}
	line := []byte(key + " = " + string(formatArray(values, false)) + "\n")
	if off := doc.offset(tf); off >= 0 {
		eol := bytes.IndexByte(data[off:], '\n')
		if eol < 0 {
			return concat(data, []byte("\n"), line), nil
		}
		at := off + eol + 1
		return concat(data[:at], line, data[at:]), nil
	}
	sep := []byte("\n")
	if len(data) > 0 && data[len(data)-1] != '\n' {
		sep = []byte("\n\n")
	}
	return concat(data, sep, []byte("["+table+"]\n"), line), nil
}

func concat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// formatArray writes values as a TOML array of basic strings, one per line when multi or long.
func formatArray(values []string, multi bool) []byte {
	q := make([]string, len(values))
	for i, v := range values {
		q[i] = strconv.Quote(v)
	}
	one := "[" + strings.Join(q, ", ") + "]"
	if !multi && len(one) <= 80 {
		return []byte(one)
	}
	var b strings.Builder
	b.WriteString("[\n")
	for _, s := range q {
		b.WriteString("    " + s + ",\n")
	}
	b.WriteString("]")
	return []byte(b.String())
}

// arraySpan finds the array value of the key at off: the offsets of its '[' and just after its ']',
// skipping strings and comments inside.
func arraySpan(data []byte, off int) (int, int, error) {
	eq := bytes.IndexByte(data[off:], '=')
	if eq < 0 {
		return 0, 0, fmt.Errorf("no '='")
	}
	i := off + eq + 1
	for i < len(data) && (data[i] == ' ' || data[i] == '\t') {
		i++
	}
	if i >= len(data) || data[i] != '[' {
		return 0, 0, fmt.Errorf("not an array")
	}
	lb, depth := i, 0
	for ; i < len(data); i++ {
		switch c := data[i]; c {
		case '[':
			depth++
		case ']':
			depth--
			if depth == 0 {
				return lb, i + 1, nil
			}
		case '#':
			for i < len(data) && data[i] != '\n' {
				i++
			}
		case '"', '\'':
			for i++; i < len(data) && data[i] != c; i++ {
				if c == '"' && data[i] == '\\' {
					i++
				}
			}
		}
	}
	return 0, 0, fmt.Errorf("unterminated array")
}

// SetString returns data with the string table.key (table "" for a top-level key) set to value,
// changing nothing else, as SetArray does. A missing top-level key is added before the first table;
// a missing key of a table under it (the table at the end if it is missing too).
func SetString(data []byte, table, key, value string) ([]byte, error) {
	doc, perr := decode(data)
	if perr != nil {
		return nil, fmt.Errorf("%s", perr.Msg)
	}
	f, tf := field{}.key(key), field{}
	if table != "" {
		tf = field{}.key(table)
		f = tf.key(key)
	}
	quoted := []byte(strconv.Quote(value))
	if off := doc.offset(f); off >= 0 {
		lb, rb, err := stringSpan(data, off)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", f.name, err)
		}
		return concat(data[:lb], quoted, data[rb:]), nil
	}
	line := concat([]byte(tomlKey(key)+" = "), quoted, []byte("\n"))
	if table == "" {
		// Before the first table header: a top-level key after one would belong to that table.
		at := len(data)
		for i := 0; i < len(data); {
			j := i
			for j < len(data) && (data[j] == ' ' || data[j] == '\t') {
				j++
			}
			if j < len(data) && data[j] == '[' {
				at = i
				break
			}
			eol := bytes.IndexByte(data[i:], '\n')
			if eol < 0 {
				break
			}
			i += eol + 1
		}
		if at == len(data) && len(data) > 0 && data[len(data)-1] != '\n' {
			line = concat([]byte("\n"), line)
		}
		return concat(data[:at], line, data[at:]), nil
	}
	if off := doc.offset(tf); off >= 0 {
		eol := bytes.IndexByte(data[off:], '\n')
		if eol < 0 {
			return concat(data, []byte("\n"), line), nil
		}
		at := off + eol + 1
		return concat(data[:at], line, data[at:]), nil
	}
	sep := []byte("\n")
	if len(data) > 0 && data[len(data)-1] != '\n' {
		sep = []byte("\n\n")
	}
	return concat(data, sep, []byte("["+table+"]\n"), line), nil
}

// tomlKey writes a key bare when TOML allows it, else quoted.
func tomlKey(k string) string {
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return strconv.Quote(k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}

// stringSpan finds the string value of the key at off: the offsets of its opening quote and just
// after its closing one (a basic or a literal string, on one line).
func stringSpan(data []byte, off int) (int, int, error) {
	eq := bytes.IndexByte(data[off:], '=')
	if eq < 0 {
		return 0, 0, fmt.Errorf("no '='")
	}
	i := off + eq + 1
	for i < len(data) && (data[i] == ' ' || data[i] == '\t') {
		i++
	}
	if i >= len(data) || (data[i] != '"' && data[i] != '\'') {
		return 0, 0, fmt.Errorf("not a string")
	}
	q, lb := data[i], i
	if bytes.HasPrefix(data[i:], []byte{q, q, q}) {
		return 0, 0, fmt.Errorf("a multi-line string: write it on one line")
	}
	for i++; i < len(data) && data[i] != '\n'; i++ {
		if q == '"' && data[i] == '\\' {
			i++
			continue
		}
		if data[i] == q {
			return lb, i + 1, nil
		}
	}
	return 0, 0, fmt.Errorf("unterminated string")
}
