package hint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// advice is what to do, in parentheses in an error's text: "(run `shed lock` first)", "(see ...)",
// "(`shed bench ls` lists yours)", "(apt-get install X)".
var advice = regexp.MustCompile("\\((run|try|use|see|pick|apt-get|make|install|reinstall|shed) |\\(`")

// TestNoAdviceInErrorText: no error of shed's carries its advice in its own text, where the
// `shed: hint:` line and an API error's hint never see it: every fmt.Errorf, errors.New and usage
// error of every package (the message argument; hints are arguments of their own) and every
// recipe error's Msg is read for it.
func TestNoAdviceInErrorText(t *testing.T) {
	// The message's position among a call's arguments, by the called function's name.
	// (fail is app's, whose message is an error of its own, and the recipe checker's, hint last.)
	message := map[string]int{"Errorf": 0, "errors.New": 0, "usageError": 0, "usage": 1, "denied": 1, "bad": 1, "fail": 1, "specErr": 1}
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "../.." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			if kv, ok := n.(*ast.KeyValueExpr); ok { // a recipe.Error's Msg, beside its Hint
				if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Msg" && advice.MatchString(literal(kv.Value)) {
					t.Errorf("%s: advice in the error's text, not in its hint: %q", fset.Position(kv.Pos()), literal(kv.Value))
				}
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var name string
			switch fn := call.Fun.(type) {
			case *ast.Ident:
				name = fn.Name
			case *ast.SelectorExpr:
				name = fn.Sel.Name
				if x, ok := fn.X.(*ast.Ident); ok && x.Name == "errors" {
					name = "errors." + name
				}
			}
			i, ok := message[name]
			if !ok || i >= len(call.Args) {
				return true
			}
			if s := literal(call.Args[i]); advice.MatchString(s) {
				t.Errorf("%s: advice in the error's text, not in its hint: %q", fset.Position(call.Pos()), s)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("read %d Go files: not the repository", checked)
	}
}

// literal is the constant text of a string literal, a concatenation of them or a Sprintf's format
// ("" for anything else).
func literal(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			s, _ := strconv.Unquote(e.Value)
			return s
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return literal(e.X) + literal(e.Y)
		}
	case *ast.ParenExpr:
		return literal(e.X)
	case *ast.CallExpr: // fmt.Sprintf's format
		if sel, ok := e.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Sprintf" && len(e.Args) > 0 {
			return literal(e.Args[0])
		}
	}
	return ""
}

func TestOf(t *testing.T) {
	base := Wrap(errString("no lock"), "run `shed lock` first")
	if got := Of(fmtWrap(base)); got != "run `shed lock` first" {
		t.Errorf("Of through a wrap: %q", got)
	}
	if Of(errString("x")) != "" || Wrap(nil, "h") != nil {
		t.Error("an error without a hint has one, or nil was wrapped")
	}
	if base.Error() != "no lock" {
		t.Errorf("the hint is in the text: %q", base.Error())
	}
}

type errString string

func (e errString) Error() string { return string(e) }

type wrapped struct{ err error }

func (w wrapped) Error() string { return "outer: " + w.err.Error() }
func (w wrapped) Unwrap() error { return w.err }

func fmtWrap(err error) error { return wrapped{err} }
