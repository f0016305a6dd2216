package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
)

// Size is the length of one function or file.
type Size struct {
	File  string // path as walked
	Line  int    // where it starts
	Name  string // function name ("Type.Method", "func literal"); "" for a whole file
	Lines int
}

func (s Size) String() string {
	if s.Name == "" {
		return fmt.Sprintf("%s: file of %d lines", s.File, s.Lines)
	}
	return fmt.Sprintf("%s:%d: %s is %d lines", s.File, s.Line, s.Name, s.Lines)
}

// Measure returns the size of every checked file under root and of every function in it.
func Measure(root string, skip []string) ([]Size, error) {
	var sizes []Size
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && skipped(root, path, d.Name(), skip) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		sizes = append(sizes, measureFile(fset, path, f)...)
		return nil
	})
	return sizes, err
}

func skipped(root, path, name string, skip []string) bool {
	if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
		return true
	}
	rel, err := filepath.Rel(root, path)
	if err != nil {
		return false
	}
	for _, s := range skip {
		if filepath.Clean(s) == rel {
			return true
		}
	}
	return false
}

func measureFile(fset *token.FileSet, path string, f *ast.File) []Size {
	tf := fset.File(f.Pos())
	sizes := []Size{{File: path, Line: 1, Lines: tf.LineCount()}}
	span := func(from, to token.Pos) (int, int) {
		start := fset.Position(from).Line
		return start, fset.Position(to).Line - start + 1
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch fn := n.(type) {
		case *ast.FuncDecl:
			if fn.Body == nil {
				return false
			}
			line, lines := span(fn.Pos(), fn.End())
			sizes = append(sizes, Size{File: path, Line: line, Name: funcName(fn), Lines: lines})
		case *ast.FuncLit:
			line, lines := span(fn.Pos(), fn.End())
			sizes = append(sizes, Size{File: path, Line: line, Name: "func literal", Lines: lines})
		}
		return true
	})
	return sizes
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	t := fn.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
			continue
		case *ast.IndexExpr:
			t = x.X
			continue
		case *ast.IndexListExpr:
			t = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fn.Name.Name
		}
		return fn.Name.Name
	}
}

// Over returns the functions longer than maxFunc and the files longer than maxFile (0: no
// file limit), longest first.
func Over(sizes []Size, maxFunc, maxFile int) []Size {
	var over []Size
	for _, s := range sizes {
		if s.Name != "" && s.Lines > maxFunc || s.Name == "" && maxFile > 0 && s.Lines > maxFile {
			over = append(over, s)
		}
	}
	sortLongest(over)
	return over
}

// Longest returns the n longest functions and the n longest files.
func Longest(sizes []Size, n int) []Size {
	var funcs, files []Size
	for _, s := range sizes {
		if s.Name == "" {
			files = append(files, s)
		} else {
			funcs = append(funcs, s)
		}
	}
	sortLongest(funcs)
	sortLongest(files)
	return append(funcs[:min(n, len(funcs))], files[:min(n, len(files))]...)
}

func sortLongest(s []Size) {
	sort.SliceStable(s, func(i, j int) bool {
		if s[i].Lines != s[j].Lines {
			return s[i].Lines > s[j].Lines
		}
		return s[i].File+fmt.Sprint(s[i].Line) < s[j].File+fmt.Sprint(s[j].Line)
	})
}
