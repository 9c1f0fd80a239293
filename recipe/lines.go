package recipe

import "fmt"

// PackageLines returns the line of each element of [apt] packages and
// [pip] packages in a recipe file, in order, so that `shed why` can point at
// the line that declared a package. data must be a recipe Parse accepted.
func PackageLines(data []byte) (apt, pip []int, err error) {
	doc, perr := decode(data)
	if perr != nil {
		return nil, nil, fmt.Errorf("%s", perr.Msg)
	}
	for _, t := range []struct {
		table string
		out   *[]int
	}{{"apt", &apt}, {"pip", &pip}} {
		f := field{}.key(t.table).key("packages")
		for i := 0; ; i++ {
			off := doc.offset(f.index(i))
			if off < 0 {
				break
			}
			*t.out = append(*t.out, doc.line(off))
		}
	}
	return apt, pip, nil
}
