// Sorting the short lists a cold sync sorts by the hundred thousand (a
// service's ports' endpoints): Array.prototype.sort allocates its work
// arrays on every call, an insertion sort in place allocates nothing.

/** Sorts in place and returns the array; insertion sort up to 16 items. */
export function sortSmall<T>(a: T[], cmp: (x: T, y: T) => number): T[] {
  if (a.length > 16) return a.sort(cmp);
  for (let i = 1; i < a.length; i++) {
    const x = a[i];
    let j = i - 1;
    while (j >= 0 && cmp(a[j], x) > 0) {
      a[j + 1] = a[j];
      j--;
    }
    a[j + 1] = x;
  }
  return a;
}
