CREATE TABLE suppliers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE products (
  id INTEGER PRIMARY KEY, sku TEXT NOT NULL UNIQUE, name TEXT NOT NULL, category TEXT NOT NULL,
  price REAL NOT NULL, stock INTEGER NOT NULL, supplier_id INTEGER REFERENCES suppliers(id));
INSERT INTO suppliers VALUES (1,'Acme Corp','US'),(2,'Nordic Parts','SE'),(3,'Kumo Ltd','JP');
INSERT INTO products VALUES
 (1,'EL-100','USB-C Cable','electronics',9.90,42,1),
 (2,'EL-101','Wireless Mouse','electronics',24.50,7,2),
 (3,'EL-102','Keyboard','electronics',49.00,0,2),
 (4,'EL-103','Monitor 27"','electronics',219.99,10,3),
 (5,'EL-104','Webcam','electronics',35.20,3,1),
 (6,'OF-200','Stapler','office',6.75,15,1),
 (7,'OF-201','Paper A4 (500)','office',4.20,9,2),
 (8,'OF-202','Desk Lamp','office',18.00,11,3),
 (9,'OF-203','Whiteboard','office',59.90,2,3),
 (10,'FU-300','Office Chair','furniture',129.00,4,2),
 (11,'FU-301','Standing Desk','furniture',349.00,12,2),
 (12,'FU-302','Bookshelf','furniture',89.50,9,1),
 (13,'EL-105','Headset, Pro','electronics',79.95,9,3);
