// The benchmark service of proto/bench/v1/bench.proto in Thrift (same calls, same data).
namespace rs bench

struct Date { 1: required i32 year; 2: required i8 month; 3: required i8 day; }
struct Address {
  1: required string city; 2: required i32 zipcode; 3: required string street; 4: required i16 number;
}
struct Subject { 1: required i32 id; 2: required string title; 3: required string code; }
struct School {
  1: required string name;
  2: required Address address;
  3: required Date foundation;
  4: required list<string> email_addresses;
}
struct Student {
  1: required string name;
  2: required i32 friends;
  3: required Address home_address;
  4: required Address birth_place;
  5: required Date birth;
  6: required list<Subject> favorite_subjects;
  7: required list<string> email_addresses;
  8: required list<School> schools;
}

service Bench {
  binary echo(1: binary data);
  i32 get_answer(1: i32 n);
  binary get_blob(1: i32 size);
  list<Student> get_structs();
  i32 nymph_uint32(1: i32 value);
  double nymph_double(1: double value);
  list<i32> nymph_array(1: list<i32> values);
  binary nymph_blob(1: binary data);
}
