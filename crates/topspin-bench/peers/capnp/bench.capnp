# The benchmark service of proto/bench/v1/bench.proto in Cap'n Proto (same calls, same data).
@0xf1d2773052098b9b;

struct Date { year @0 :Int32; month @1 :Int8; day @2 :Int8; }
struct Address { city @0 :Text; zipcode @1 :Int32; street @2 :Text; number @3 :Int16; }
struct Subject { id @0 :Int32; title @1 :Text; code @2 :Text; }
struct School {
  name @0 :Text;
  address @1 :Address;
  foundation @2 :Date;
  emailAddresses @3 :List(Text);
}
struct Student {
  name @0 :Text;
  friends @1 :Int32;
  homeAddress @2 :Address;
  birthPlace @3 :Address;
  birth @4 :Date;
  favoriteSubjects @5 :List(Subject);
  emailAddresses @6 :List(Text);
  schools @7 :List(School);
}

interface Bench {
  echo @0 (data :Data) -> (data :Data);
  getAnswer @1 (n :Int32) -> (answer :Int32);
  getBlob @2 (size :UInt32) -> (data :Data);
  getStructs @3 () -> (students :List(Student));
  nymphUint32 @4 (value :UInt32) -> (value :UInt32);
  nymphDouble @5 (value :Float64) -> (value :Float64);
  nymphArray @6 (values :List(UInt32)) -> (values :List(UInt32));
  nymphBlob @7 (data :Data) -> (data :Data);
}
