// eslint flat config: the recommended rules of eslint and typescript-eslint (type-aware).
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  // pack/ is a user's project (it imports @topspin/topspin as installed): pack/check.sh
  // type-checks it with tsc --strict in a fresh project where the package is installed.
  { ignores: ["dist/**", "node_modules/**", "gen/**", "src/gen/**", "browser/out/**", "pack/**", "eslint.config.js"] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
    },
  },
  // The package's own code (not tests, benchmarks or generated code): no function over 80 lines,
  // every line counted (blank lines and comments too).
  {
    files: ["src/**"],
    rules: { "max-lines-per-function": ["error", { max: 80, skipBlankLines: false, skipComments: false, IIFEs: true }] },
  },
  // node:test's test() returns a promise the runner awaits itself.
  { files: ["test/**"], rules: { "@typescript-eslint/no-floating-promises": "off" } },
);
