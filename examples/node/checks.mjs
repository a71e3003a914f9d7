// The examples' self-checks, not what they show: `make test-examples` runs each example
// and fails on a non-zero exit.
let failures = 0;

export function check(ok, what) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures += 1;
}

/** Exit 1 if a check failed; otherwise say that all passed. */
export function finish() {
  if (failures > 0) {
    console.error(`${failures} check(s) failed`);
    process.exit(1);
  }
  console.log('all checks passed');
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
