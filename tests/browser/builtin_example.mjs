// The built-in example's inputs (src/explain/builtin_example.cc: films, the genre and value
// projections, users' tastes) and the attention worked out from them here, in float64, so that
// the page's numbers are checked against arithmetic that does not run through qkv.
export const FILMS = ['Alien', 'Die Hard', 'Notting Hill', 'Groundhog Day', 'The Matrix', 'Titanic'];
export const USERS = ['Ana', 'Ben', 'Chloe', 'Dev'];
export const GENRES = ['action', 'sci-fi', 'romance', 'comedy'];
export const GIVES = ['thrill', 'laughs', 'tears'];

const films = [
  [0.2, 1.0, 0.0, 0.1, 0.6],
  [1.0, 0.0, 0.1, 0.4, 0.0],
  [0.0, 0.0, 1.0, 0.8, 0.2],
  [0.1, 0.0, 0.5, 1.0, 0.0],
  [0.8, 0.7, 0.2, 0.1, 0.1],
  [0.0, 0.0, 1.0, 0.0, 1.0],
];
const wk = [[1, 0, 0, 0], [0.3, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0.5, -0.5]];
const wv = [[1, 0.1, 0], [0.8, 0, 0], [0, 0, 0.3], [0, 1, 0], [0.2, 0, 1]];
const users = [[2, 3, 0, 0], [0, 0, 3, 1], [0, 0, 1, 3], [1, 1, 1, 1]];

function matmul(a, b) {
  return a.map((row) => b[0].map((_, c) => row.reduce((s, x, k) => s + x * b[k][c], 0)));
}

// Part 0: users (W^Q = I) against films; part 1: films against films (W^Q = W^K).
// Returns { q, k, v, w, o } with w the softmax weights at scale 1/sqrt(d_k) = 1/2.
export function builtinAttention(part) {
  const k = matmul(films, wk);
  const v = matmul(films, wv);
  const q = part === 0 ? users : k;
  const w = q.map((qi) => {
    const s = k.map((kj) => 0.5 * qi.reduce((acc, x, c) => acc + x * kj[c], 0));
    const m = Math.max(...s);
    const e = s.map((x) => Math.exp(x - m));
    const sum = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / sum);
  });
  const o = matmul(w, v);
  return { q, k, v, w, o };
}
