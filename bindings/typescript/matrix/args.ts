// Command-line arguments of the matrix clients (testdata/matrix/README.md): `--target ADDR`,
// and for the Node client `--ca FILE`.

/** The `--target` address of `argv` (throws on anything else). */
export function targetArg(argv: string[]): string {
  const { target, ca } = clientArgs(argv);
  if (ca !== undefined) throw new Error("unknown argument --ca (this client has no TLS)");
  return target;
}

/** `--target ADDR` and the optional `--ca FILE` of `argv` (throws on anything else). */
export function clientArgs(argv: string[]): { target: string; ca?: string } {
  let target: string | undefined;
  let ca: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? "";
    if (a === "--target" && i + 1 < argv.length) target = argv[++i];
    else if (a.startsWith("--target=")) target = a.slice("--target=".length);
    else if (a === "--ca" && i + 1 < argv.length) ca = argv[++i];
    else if (a.startsWith("--ca=")) ca = a.slice("--ca=".length);
    else throw new Error(`unknown argument ${a}`);
  }
  if (target === undefined || target === "") throw new Error("usage: [--ca FILE] --target ADDR");
  return ca === undefined ? { target } : { target, ca };
}
