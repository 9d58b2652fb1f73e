package node

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// roleWriters are the calls that write a node's role, term or fence
// outside package failover (whose Node keeps role and term unexported).
var roleWriters = []string{"SetRole", "RefuseBelow", "Receiver.Fence", "SetTerm"}

// TestOneRoleWriter: in the product's code, the only function that tells
// the server and the receiver a role, a term or a fence is pushRole (the
// authority's one setter; the server's Switchover takes the role the
// authority hands it through setRoleLocked, which is not a writer's
// name); hypervisor.Server passes the term on to its log.
func TestOneRoleWriter(t *testing.T) {
	allowed := map[string]bool{
		"internal/node.pushRole":   true,
		"hypervisor.setRoleLocked": true, // the term, on to the server's log
		"hypervisor.Replicate":     true, // the server's term, on to a new log
	}
	found := 0
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() && (strings.HasPrefix(rel, filepath.Join("internal", "lab")) || strings.HasPrefix(d.Name(), ".")) && rel != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				name := callName(call)
				for _, w := range roleWriters {
					if name == w || strings.HasSuffix(name, "."+w) {
						found++
						if !allowed[pkg+"."+fn.Name.Name] {
							t.Errorf("%s: %s calls %s: only the authority's pushRole writes a role, a term or a fence", path, fn.Name.Name, name)
						}
					}
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 4 {
		t.Fatalf("found only %d role writes: the check would not see them", found)
	}
}

// callName is a call's function as written: "f", "x.f" or "x.y.f" (the
// last two selectors).
func callName(call *ast.CallExpr) string {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		if id, ok := call.Fun.(*ast.Ident); ok {
			return id.Name
		}
		return ""
	}
	switch x := sel.X.(type) {
	case *ast.SelectorExpr:
		return x.Sel.Name + "." + sel.Sel.Name
	case *ast.Ident:
		return x.Name + "." + sel.Sel.Name
	}
	return sel.Sel.Name
}
