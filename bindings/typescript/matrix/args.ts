// Command-line arguments of the matrix clients (testdata/matrix/README.md): `--target ADDR`.

/** The `--target` address of `argv` (throws on anything else). */
export function targetArg(argv: string[]): string {
  let target: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? "";
    if (a === "--target" && i + 1 < argv.length) target = argv[++i];
    else if (a.startsWith("--target=")) target = a.slice("--target=".length);
    else throw new Error(`unknown argument ${a}`);
  }
  if (target === undefined || target === "") throw new Error("usage: --target ADDR");
  return target;
}
