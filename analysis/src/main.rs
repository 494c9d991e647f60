fn main() { println!("dflash-analyze"); }
