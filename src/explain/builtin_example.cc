// The built-in example: the films-and-users analogy with numbers small enough to read.
//
// Films are samples described by what is in them. Two different projections of the same film
// rows give its key (which genres it belongs to: what a taste can match) and its value (what
// watching it gives you: thrill, laughs, tears). Users' tastes, already in genre terms, are the
// queries. Cross-attention "recommends" films to each user: O_i is the weighted sum of what
// every film gives, weighted by how well the film's genres match the user's taste. Then
// self-attention over the films: each film's query is its own genre profile (W^Q = W^K), so a
// film attends to films like itself.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "qkv/explain.h"

namespace qkv {
namespace {

// What is in each film: car chases, spaceships, kisses, jokes, a sad ending.
constexpr double kFilms[6][5] = {
    {0.2, 1.0, 0.0, 0.1, 0.6},  // Alien
    {1.0, 0.0, 0.1, 0.4, 0.0},  // Die Hard
    {0.0, 0.0, 1.0, 0.8, 0.2},  // Notting Hill
    {0.1, 0.0, 0.5, 1.0, 0.0},  // Groundhog Day
    {0.8, 0.7, 0.2, 0.1, 0.1},  // The Matrix
    {0.0, 0.0, 1.0, 0.0, 1.0},  // Titanic
};

// W^K: from what is in a film to its genres (action, sci-fi, romance, comedy). A sad ending
// counts towards romance and against comedy.
constexpr double kWk[5][4] = {
    {1.0, 0.0, 0.0, 0.0},   // car chases
    {0.3, 1.0, 0.0, 0.0},   // spaceships
    {0.0, 0.0, 1.0, 0.0},   // kisses
    {0.0, 0.0, 0.0, 1.0},   // jokes
    {0.0, 0.0, 0.5, -0.5},  // a sad ending
};

// W^V: from the same film rows to what watching it gives (thrill, laughs, tears).
constexpr double kWv[5][3] = {
    {1.0, 0.1, 0.0},  // car chases
    {0.8, 0.0, 0.0},  // spaceships
    {0.0, 0.0, 0.3},  // kisses
    {0.0, 1.0, 0.0},  // jokes
    {0.2, 0.0, 1.0},  // a sad ending
};

// Users' tastes, in genre terms (action, sci-fi, romance, comedy), 0 to 3.
constexpr double kUsers[4][4] = {
    {2.0, 3.0, 0.0, 0.0},  // Ana: science fiction and action
    {0.0, 0.0, 3.0, 1.0},  // Ben: romance
    {0.0, 0.0, 1.0, 3.0},  // Chloe: comedy
    {1.0, 1.0, 1.0, 1.0},  // Dev: a bit of everything
};

// W^Q for users: their tastes already are in genre terms.
constexpr double kWqUsers[4][4] = {
    {1.0, 0.0, 0.0, 0.0}, {0.0, 1.0, 0.0, 0.0}, {0.0, 0.0, 1.0, 0.0}, {0.0, 0.0, 0.0, 1.0}};

const std::vector<std::string> kFilmNames = {"Alien",         "Die Hard",   "Notting Hill",
                                             "Groundhog Day", "The Matrix", "Titanic"};
const std::vector<std::string> kUserNames = {"Ana", "Ben", "Chloe", "Dev"};

// What the coordinates mean: the columns of the film rows, of keys (and tastes), of values.
const std::vector<std::string> kFilmContents = {"car chases", "spaceships", "kisses", "jokes",
                                                "sad ending"};
const std::vector<std::string> kGenres = {"action", "sci-fi", "romance", "comedy"};
const std::vector<std::string> kGives = {"thrill", "laughs", "tears"};

constexpr const char* kRecommendStory =
    "Four users and six films. A user's taste is the query: how much they like action, sci-fi, "
    "romance and comedy. A film's key says which of those genres it belongs to, and its value "
    "what watching it gives: thrill, laughs, tears. Both come from the same row of the film "
    "(what is in it: car chases, spaceships, kisses, jokes, a sad ending), through W^K and "
    "W^V.\n\n"
    "The score of a film for a user is how well its genres match the taste (q_i·k_j, scaled). "
    "The softmax turns the scores into weights that sum to 1, and the user's output O_i is the "
    "weighted sum of what every film gives: not one recommended film, but a blend of all of "
    "them, the good matches counting most.";
constexpr const char* kFilmsStory =
    "Self-attention over the same films: each film's query is its own genre profile "
    "(W^Q = W^K), so a film attends most to the films of its own genres, and its output blends "
    "what those films give.\n\n"
    "Keys and values are two transforms of the same rows: the key decides how much a film "
    "counts, the value is what it brings.";

template <std::size_t R, std::size_t C>
TensorView view_of(const double (&m)[R][C], const char* name) {
  return TensorView{m,
                    DType::kF64,
                    {static_cast<std::int64_t>(R), static_cast<std::int64_t>(C)},
                    {static_cast<std::int64_t>(C), 1},
                    name};
}

}  // namespace

std::vector<Explanation> builtin_examples() {
  LayerOptions options;
  options.heads = 1;
  options.attention.threads = 1;
  // The reference kernel: float64 straight from the formulas, so that the example's printed
  // numbers are exact and do not change with the machine's fastest kernel.
  options.attention.kernel = "reference";

  ExplainSetup users;
  users.title =
      "Cross-attention: users' tastes (queries) against films' genres (keys); values are what "
      "each film gives (thrill, laughs, tears)";
  users.story = kRecommendStory;
  users.query_labels = kUserNames;
  users.key_labels = kFilmNames;
  users.d_labels = kGenres;
  users.dv_labels = kGives;
  users.sample_labels = kGenres;  // a taste is already in genre terms
  users.memory_labels = kFilmContents;
  const LayerWeights user_weights{view_of(kWqUsers, "W^Q (tastes)"), view_of(kWk, "W^K (genres)"),
                                  view_of(kWv, "W^V (what it gives)")};
  Explanation recommend = explain_layer(view_of(kUsers, "users"), user_weights, options,
                                        view_of(kFilms, "films"), users);

  ExplainSetup films;
  films.title =
      "Self-attention over the films: each film's query is its own genre profile (W^Q = W^K), "
      "so a film attends to films like itself";
  films.story = kFilmsStory;
  films.query_labels = kFilmNames;
  films.key_labels = kFilmNames;
  films.d_labels = kGenres;
  films.dv_labels = kGives;
  films.sample_labels = kFilmContents;
  const LayerWeights film_weights{view_of(kWk, "W^Q = W^K (genres)"), view_of(kWk, "W^K (genres)"),
                                  view_of(kWv, "W^V (what it gives)")};
  Explanation similar =
      explain_layer(view_of(kFilms, "films"), film_weights, options, std::nullopt, films);

  std::vector<Explanation> parts;
  parts.push_back(std::move(recommend));
  parts.push_back(std::move(similar));
  return parts;
}

}  // namespace qkv
